"""The memory cases: the throughput preset's candidates at world size 8, each a valid config of
the benchmark, as HSDP (4 ranks a node) or FSDP over all 8."""

from __future__ import annotations

from bench.train_bench.memory import MEMORY_CASES
from bench.train_bench.session import benchmark_config


def test_each_batch_and_recompute_choice_runs_on_both_meshes_and_the_deferred_cases_accumulate_two():
    assert len(MEMORY_CASES) == 2 * 2 * 2 + 2
    for name, (overrides, ranks_per_node) in MEMORY_CASES.items():
        config = benchmark_config("tiny", 1, **overrides)
        if "hsdp-2x4" in name:
            assert (config.hsdp_replicas, ranks_per_node) == (0, 4)  # 0: a replica per node
        else:
            assert (config.hsdp_replicas, ranks_per_node) == (1, 8)
        assert config.seq_len == 4096 and name.startswith(f"seq4096x{config.batch_size}-")
        assert config.activation_checkpointing == ("-no-ac-" not in name)
        deferred = name.endswith("-accum2-deferred")
        assert (config.grad_accum_steps, config.defer_grad_sync) == ((2, True) if deferred else (1, False))
