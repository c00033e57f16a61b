"""The TrainingRun's outputs as `RunOutputs` declares them, and the stack outputs `training` and `benchmark`."""

from __future__ import annotations

from workloads.training_run import outputs


def test_the_benchmark_output_shows_the_efa_run_beside_the_tcp_baseline():
    """The stack output `benchmark` as `RunOutputs` declares it: the EFA run's figures under `efa*`
    keys, the TCP baseline's under `tcp*`, and the speed-up."""
    assert outputs.benchmark_output_keys() == {
        "efaTokensPerS": "tokens_per_s",
        "efaBytes": "efa_bytes",
        "efaBusbwGbps": "busbw_gbps",
        "tcpTransport": "tcp_transport",
        "tcpTokensPerS": "tcp_tokens_per_s",
        "tcpEfaBytes": "tcp_efa_bytes",
        "tcpBusbwGbps": "tcp_busbw_gbps",
        "efaSpeedup": "efa_speedup",
    }


def test_the_training_output_shows_the_declared_outputs_camelcased():
    """The stack output `training` as `RunOutputs` declares it: the `shown` outputs at its top or in
    `gate` (named without the prefix), the line rate and counter-check inputs beside them; the others are the resource's."""
    keys = outputs.training_output_keys()
    assert keys[outputs.TOP] == {
        "jobId": "job_id",
        "status": "status",
        "transport": "transport",
        "evidence": "evidence",
        "tokensPerS": "tokens_per_s",
        "mfu": "mfu",
        "mfuDone": "mfu_done",
        "stepTimeS": "step_time_s",
        "durationS": "duration_s",
        "efaBytes": "efa_bytes",
        "efaCounters": "efa_counters",
        "efaUnavailable": "efa_unavailable",
        "busbwGbps": "busbw_gbps",
        "busbwFraction": "busbw_fraction",
        "gpuNodesReleasedAt": "gpu_nodes_released_at",
        "restarts": "restarts",
        "attempts": "attempts",
        "lineRateGbps": "line_rate_gbps",
        "checkEfaCounters": "check_efa_counters",
    }
    assert keys[outputs.GATE] == {
        "jobId": "gate_job_id",
        "transport": "gate_transport",
        "evidence": "gate_evidence",
        "efaBytes": "gate_efa_bytes",
        "efaUnavailable": "gate_efa_unavailable",
        "seconds": "gate_s",
    }


def test_the_training_output_reads_each_shown_output_of_the_resource():
    class Run:
        def __getattr__(self, name: str) -> str:
            return f"<{name}>"

    shown = outputs.training_output(Run())
    assert shown["tokensPerS"] == "<tokens_per_s>" and shown["lineRateGbps"] == "<line_rate_gbps>"
    assert shown["gate"] == {key: f"<{name}>" for key, name in outputs.training_output_keys()["gate"].items()}
    assert "summary" not in shown and "transportReason" not in shown
