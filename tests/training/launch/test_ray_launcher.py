"""The training job end to end on CPU: 2 workers, tiny Qwen2, FSDP2 on gloo.

Runs through the real CLI: an uninterrupted run on an embedded Ray (`--local`) that
checkpoints every 4 steps (shared by several tests); the runs that start from its
checkpoints, a run whose rank-0 worker is SIGKILLed mid-way and must come back from its
latest checkpoint, and the other runs join the session's Ray head through RAY_ADDRESS
(tests/harness/ray_head.py), as a job's driver joins the RayCluster's head, which saves each
its own Ray start. Plus runs under torchrun, the launcher of the GPU benchmark machine,
which has no Ray.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cli_runs import REPO_ROOT, RUN_TIMEOUT_S, printed_summary, run_cli, step_lines
from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from tests.harness.tensorboard_events import read_scalars
from training.metrics.efa_sysfs import COUNTERS_URL_ENV, SYSFS_ROOT_ENV, counter_server
from training.metrics.report import STEP_KEYS, SUMMARY_KEYS, parse_step_line, parse_summary

pytestmark = pytest.mark.slow

STEPS = 8
CHECKPOINT_EVERY = 4
# Ray prefixes each forwarded worker line with the worker's process id.
WORKER_PID = re.compile(r"\(RayTrainWorker pid=(\d+)")
# --standalone picks a free rendezvous port, so parallel runs on one machine do not collide.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def on_the_head(workers: int = 2) -> tuple[str, ...]:
    """A run that joins a Ray cluster names its worker group: CPU workers need --no-gpu and a count."""
    return ("--no-gpu", "--workers", str(workers))


def run_on_head(head, *args: str, workers: int = 2) -> subprocess.CompletedProcess:
    """`python -m training` as a driver of the session's Ray head (RAY_ADDRESS), not `--local`."""
    return run_cli(*on_the_head(workers), *args, env=head.env)


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def with_fake_efa(tmp_path_factory) -> dict[str, str]:
    """The environment of a run on a host with one EFA device, faked: a sysfs tree in the EFA
    driver's layout as the host's network namespace shows it (`FakeEfaSysfs.root`), where the
    training job's first rank of the node reads it (torchrun on an EC2 instance).
    gloo's traffic goes over loopback, not through it: its counters stay put, so each step moved 0."""
    root = FakeEfaSysfs(tmp_path_factory.mktemp("infiniband")).root
    return {**os.environ, SYSFS_ROOT_ENV: str(root)}


@pytest.fixture(scope="module")
def as_in_a_worker_pod(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment of a Ray worker pod on an EFA node, as on EKS: its own sysfs shows the compat
    device without counters (`FakeEfaSysfs.pod_view`), and `TRAINING_EFA_COUNTERS_URL` names its
    node's counter reader, served here by the reader's own server over the host's view."""
    node = FakeEfaSysfs(tmp_path_factory.mktemp("infiniband"))
    server = counter_server("127.0.0.1", 0, str(node.root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {
            **os.environ,
            SYSFS_ROOT_ENV: str(node.pod_view),
            COUNTERS_URL_ENV: f"http://127.0.0.1:{server.server_address[1]}/",
        }
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def full_run(storage, as_in_a_worker_pod) -> subprocess.CompletedProcess:
    result = run_cli(
        "--local",
        "--steps", str(STEPS),
        "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--storage-path", str(storage),
        "--run-name", "full",
        env=as_in_a_worker_pod,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def resumed_run(storage, full_run, ray_head) -> subprocess.CompletedProcess:
    result = run_on_head(
        ray_head,
        "--steps", str(STEPS),
        "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--storage-path", str(storage),
        "--run-name", "resumed",
        "--resume-from", str(storage / "full" / "checkpoint_000004"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_last_stdout_line_is_the_run_summary(full_run):
    summary = printed_summary(full_run.stdout)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert parse_summary(full_run.stdout) == summary
    assert (summary["world_size"], summary["steps"], summary["steps_run"]) == (2, STEPS, STEPS)
    assert summary["mfu"] is None and summary["gpu_name"] is None and summary["device"] == "cpu"
    assert summary["tokens_per_s"] > 0 and summary["tokens_per_s_per_gpu"] == pytest.approx(
        summary["tokens_per_s"] / 2
    )
    assert summary["peak_mem_gib"] > 0 and summary["step_time_s"] > 0


def test_every_step_prints_a_progress_line_and_a_parseable_line(full_run):
    steps = step_lines(full_run.stdout)
    assert [entry["step"] for entry in steps] == list(range(1, STEPS + 1))
    assert all(set(STEP_KEYS) == set(entry) and entry["steps"] == STEPS for entry in steps)
    progress = [line for line in full_run.stdout.splitlines() if f"/{STEPS} | loss " in line]
    assert len(progress) == STEPS


def test_a_run_into_a_pipe_has_no_colour_codes_and_no_known_noise(full_run):
    output = full_run.stdout + full_run.stderr
    assert "\x1b[" not in output
    for noise in ("PreemptionWatcher", "RayDeprecationWarning", "SplitCoordinator", "Starting execution of"):
        assert noise not in output, noise


def test_loss_decreases_on_the_shipped_corpus(full_run):
    summary = printed_summary(full_run.stdout)
    assert summary["data"] == "corpus"
    assert summary["loss_last"] < 0.8 * summary["loss_first"]


def test_run_folder_holds_summary_picture_and_checkpoints(full_run, storage):
    run_dir = storage / "full"
    printed = printed_summary(full_run.stdout)
    assert printed["run_dir"] == str(run_dir) and printed["summary_path"] == str(run_dir / "summary.json")
    saved = json.loads((run_dir / "summary.json").read_text())
    assert [entry["step"] for entry in saved.pop("history")] == list(range(1, STEPS + 1))
    assert saved == printed
    assert (run_dir / "run.png").read_bytes().startswith(b"\x89PNG")
    for step in (4, 8):
        checkpoint = run_dir / f"checkpoint_{step:06d}"
        assert {".metadata", "__0_0.distcp", "__1_0.distcp", "train_state.json"} <= set(
            os.listdir(checkpoint)
        )
        assert json.loads((checkpoint / "train_state.json").read_text())["step"] == step


def test_resume_continues_the_step_count_and_matches_the_uninterrupted_run(full_run, resumed_run, storage):
    uninterrupted = {entry["step"]: entry["loss"] for entry in step_lines(full_run.stdout)}
    resumed = {entry["step"]: entry["loss"] for entry in step_lines(resumed_run.stdout)}
    assert "resumed from step 4" in resumed_run.stdout
    assert sorted(resumed) == list(range(CHECKPOINT_EVERY + 1, STEPS + 1))
    # Same weights, optimizer state and replayed data: the same losses, up to reduction order.
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-3), step
    summary = printed_summary(resumed_run.stdout)
    assert (summary["start_step"], summary["steps_run"]) == (CHECKPOINT_EVERY, STEPS - CHECKPOINT_EVERY)
    history = json.loads((storage / "resumed" / "summary.json").read_text())["history"]
    assert [entry["step"] for entry in history] == list(range(1, STEPS + 1))


def test_a_second_run_trains_from_the_corpus_cache_the_first_one_wrote(full_run, resumed_run, storage):
    """The resumed run (same corpus, tokenizer and --seq-len, same storage) reads the rows the full
    run packed, and trains on them to the same losses (the test above)."""
    written = [line for line in full_run.stdout.splitlines() if "into the corpus cache" in line]
    read = [line for line in resumed_run.stdout.splitlines() if "corpus cache" in line]
    assert (
        len(written) == 1 and "--data " in written[0] and " 130 rows of 129 tokens tokenized " in written[0]
    )
    assert read == [written[0].replace("tokenized into", "read from")]
    assert written[0].endswith(str(storage / "corpus-cache" / written[0].rsplit("/", 1)[-1]))


def resumed_on_one_worker(head, storage: Path, run_name: str, *flags: str) -> subprocess.CompletedProcess:
    """The full run's step-4 checkpoint (2 workers x --batch-size 8) resumed to step 6 on 1 worker."""
    return run_on_head(
        head,
        "--steps", "6",
        "--checkpoint-every", "0",
        "--storage-path", str(storage),
        "--run-name", run_name,
        "--resume-from", str(storage / "full" / "checkpoint_000004"),
        *flags,
        workers=1,
    )  # fmt: skip


def test_a_resume_on_one_worker_with_two_micro_batches_reshards_and_trains_as_the_two_workers(
    full_run, storage, ray_head
):
    """DCP reshards the step-4 checkpoint of 2 workers x 8 onto 1 worker x 8 x 2 micro-batches, the
    same global batch: steps 5 and 6 train on the rows of the uninterrupted run, to its losses (up
    to the order of the sums)."""
    result = resumed_on_one_worker(ray_head, storage, "one-worker", "--grad-accum-steps", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed from step 4" in result.stdout and "resharded from 2 workers to 1" in result.stdout
    resumed = {entry["step"]: entry["loss"] for entry in step_lines(result.stdout)}
    uninterrupted = {entry["step"]: entry["loss"] for entry in step_lines(full_run.stdout)}
    assert sorted(resumed) == [5, 6]
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-3), step
    summary = printed_summary(result.stdout)
    assert (summary["start_step"], summary["world_size"], summary["resharded"]) == (4, 1, True)


def test_a_resume_that_would_halve_the_global_batch_exits_2_in_one_line(full_run, storage, ray_head):
    result = resumed_on_one_worker(ray_head, storage, "halved")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-4000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"python -m training: error: {storage / 'full' / 'checkpoint_000004'} was written with a global "
        "batch of 16 sequences (world size 2 x --batch-size 8 x --grad-accum-steps 1); this run's is 8 "
        "(1 x 8 x 1): pass --grad-accum-steps 2 to keep it, or take its weights alone with --init-from"
    )


def test_a_resume_from_the_last_step_exits_2_in_one_line_before_ray_starts(full_run, storage):
    """Judged on the driver from the checkpoint's train_state.json: no Ray, no worker."""
    checkpoint = storage / "full" / f"checkpoint_{STEPS:06d}"
    result = run_cli(
        "--local", "--steps", str(STEPS), "--storage-path", str(storage), "--run-name", "past",
        "--resume-from", str(checkpoint),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-4000:]
    assert "Started a local Ray" not in result.stderr and not (storage / "past").exists()
    assert result.stderr.strip().splitlines()[-1] == (
        f"python -m training: error: {checkpoint} is at step {STEPS}: --steps {STEPS} leaves nothing "
        f"to train; pass --steps > {STEPS}"
    )


def test_a_relative_model_folder_reaches_the_ray_workers(full_run, storage, ray_head):
    """The run's last checkpoint, exported after the run, fine-tuned on through a --model-id
    relative to the driver's working directory (the workers run in another: the head's folder)."""
    from training.export import main as export

    exported = storage / "full-hf"
    assert (
        export([str(storage / "full" / f"checkpoint_{STEPS:06d}"), str(exported), "--export-dtype", "fp32"])
        == 0
    )
    result = run_on_head(
        ray_head, "--steps", "1", "--checkpoint-every", "0", "--storage-path", str(storage),
        "--run-name", "from-export", "--init", "pretrained",
        "--model-id", os.path.relpath(exported, REPO_ROOT), "--tokenizer", "bytes",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    # The trained weights, not a random init: the step-1 loss is near the run's last, not 5.55.
    last = step_lines(full_run.stdout)[-1]["loss"]
    assert printed_summary(result.stdout)["loss_first"] == pytest.approx(last, abs=0.3)


def test_torchrun_trains_on_the_same_corpus_rows_as_ray(full_run, storage):
    """Same seed, same packed rows, same per-rank batches: the same losses step by step."""
    result = run_cli(
        "--launcher", "torchrun",
        "--steps", str(STEPS),
        "--checkpoint-every", "0",
        "--storage-path", str(storage),
        "--run-name", "torchrun-corpus",
        # Packed again in-process, not read from the cache the Ray run wrote.
        "--corpus-cache", str(storage / "torchrun-corpus-cache"),
        launcher=TORCHRUN,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert printed_summary(result.stdout)["data"] == "corpus"
    on_ray = [entry["loss"] for entry in step_lines(full_run.stdout)]
    on_torchrun = [entry["loss"] for entry in step_lines(result.stdout)]
    assert len(on_torchrun) == STEPS
    assert on_torchrun == pytest.approx(on_ray, abs=1e-5)


def test_a_resume_with_gradient_accumulation_matches_the_uninterrupted_run(storage):
    """Two micro-batches per step on the shipped corpus (8 batches per rank and epoch): the run
    resumed from step 2 skips the 4 batches steps 1 and 2 consumed, so steps 3 and 4 train on
    the rows, and give the losses, of the uninterrupted run."""
    flags = ("--launcher", "torchrun", "--steps", "4", "--checkpoint-every", "2", "--grad-accum-steps", "2")
    full = run_cli(*flags, "--storage-path", str(storage), "--run-name", "accum", launcher=TORCHRUN)
    assert full.returncode == 0, full.stderr[-4000:]
    resumed = run_cli(
        *flags,
        "--storage-path", str(storage),
        "--run-name", "accum-resumed",
        "--resume-from", str(storage / "accum" / "checkpoint_000002"),
        launcher=TORCHRUN,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from step 2" in resumed.stdout
    uninterrupted = {entry["step"]: entry["loss"] for entry in step_lines(full.stdout)}
    replayed = {entry["step"]: entry["loss"] for entry in step_lines(resumed.stdout)}
    assert sorted(replayed) == [3, 4]
    for step, loss in replayed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-5), step
    summary = printed_summary(full.stdout)
    assert summary["grad_accum_steps"] == 2
    assert summary["tokens_per_step"] == 2 * 8 * 128 * 2  # workers x batch x seq x micro-batches
    # Text trains on every label of its packed rows; the count spans both ranks.
    assert summary["tokens_seen"] == summary["loss_tokens"] == 4 * 2 * 8 * 128 * 2


def test_short_documents_and_held_out_rows_go_through_the_corpus_cache_and_train(tmp_path, ray_head):
    """Hundreds of training documents each far below seq_len tokens (only packing across
    documents makes rows), and --eval-data, which goes through the cache as --data does: its own
    entry, mapped by the workers, and evaluated."""
    corpus = tmp_path / "notes"
    corpus.mkdir()
    for index in range(300):
        (corpus / f"note_{index:03d}.txt").write_text(
            f"Note {index}: the kettle boiled at {index % 60} past."
        )
    held_out = tmp_path / "held-out"
    held_out.mkdir()
    (held_out / "one.txt").write_text("A sentence the model never trains on. " * 80)
    cache = tmp_path / "cache"
    result = run_on_head(
        ray_head,
        "--data", str(corpus),
        "--steps", "3",
        "--checkpoint-every", "0",
        "--eval-data", str(held_out),
        "--storage-path", str(tmp_path / "runs"),
        "--run-name", "notes",
        "--corpus-cache", str(cache),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    packed = [line for line in result.stdout.splitlines() if "tokenized into the corpus cache" in line]
    assert len(packed) == 2 and packed[0].startswith(f"--data {corpus}: ")
    assert packed[1].startswith(f"--eval-data {held_out}: 23 rows of 129 tokens ")
    assert len([entry for entry in cache.iterdir() if entry.is_dir()]) == 2
    summary = printed_summary(result.stdout)
    assert (summary["data"], summary["steps_run"]) == ("corpus", 3)
    assert summary["eval_loss"] is not None and summary["eval_loss"] > 0


TORCHRUN_FLAGS = ("--launcher", "torchrun", "--data", "synthetic", "--steps", "3", "--checkpoint-every", "0")


@pytest.fixture(scope="module")
def torchrun_run(storage, with_fake_efa) -> subprocess.CompletedProcess:
    """Plain FSDP over 2 ranks, exporting a Hugging Face model at the end, with a fake EFA tree."""
    result = run_cli(
        *TORCHRUN_FLAGS,
        "--export-hf",
        "--line-rate-gbps",
        "40",
        "--storage-path",
        str(storage),
        "--run-name",
        "torchrun",
        launcher=TORCHRUN,
        env=with_fake_efa,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_torchrun_launcher_runs_the_same_loop_and_exports_a_hugging_face_model(torchrun_run, storage):
    from transformers import AutoModelForCausalLM

    summary = printed_summary(torchrun_run.stdout)
    assert (summary["world_size"], summary["steps"], summary["data"]) == (2, 3, "synthetic")
    assert [entry["step"] for entry in step_lines(torchrun_run.stdout)] == [1, 2, 3]
    assert (storage / "torchrun" / "summary.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(storage / "torchrun" / "checkpoint_000003" / "hf")
    assert sum(p.numel() for p in exported.parameters()) == summary["parameters"]


def test_hsdp_and_activation_checkpointing_keep_the_math_of_plain_fsdp(torchrun_run, storage):
    """Replicating across 2 groups (HSDP) and recomputing layers change where work happens,
    not the result: losses match plain FSDP step for step."""
    result = run_cli(
        *TORCHRUN_FLAGS,
        "--hsdp-replicas", "2",
        "--activation-checkpointing",
        "--storage-path", str(storage),
        "--run-name", "hsdp",
        launcher=TORCHRUN,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert printed_summary(result.stdout)["hsdp_replicas"] == 2
    hsdp = [entry["loss"] for entry in step_lines(result.stdout)]
    fsdp = [entry["loss"] for entry in step_lines(torchrun_run.stdout)]
    assert len(hsdp) == 3
    assert hsdp == pytest.approx(fsdp, abs=1e-5)
    # This machine has no EFA device and no fake tree was given: the fields are absent, not zero.
    assert not [entry for entry in step_lines(result.stdout) if "efa_bytes_per_s" in entry]
    assert "efa_bytes_per_s" not in printed_summary(result.stdout) and "| EFA " not in result.stdout


def assert_efa_bytes_in_steps_summary_and_tensorboard(
    run: subprocess.CompletedProcess, run_dir: Path
) -> dict:
    """Each step line, progress line, the summary (printed and summary.json) and TensorBoard carry
    the node's EFA bytes/s (0: the fake counters did not move); the one node is this host."""
    node = socket.gethostname()
    steps = step_lines(run.stdout)
    assert steps and all(entry["efa_bytes_per_s"] == {node: 0.0} for entry in steps)
    assert all("| EFA 0.00 GB/s" in line for line in run.stdout.splitlines() if " | loss " in line)
    summary = printed_summary(run.stdout)
    assert summary["efa_bytes_per_s"] == {node: 0.0} and summary["efa_bytes_per_step"] == {node: 0.0}
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["efa_bytes_per_s"] == summary["efa_bytes_per_s"]
    curve = read_scalars(run_dir / "tensorboard")[f"network/efa_bytes_per_s/{node}"]
    assert sorted(curve) == [entry["step"] for entry in steps] and set(curve.values()) == {0.0}
    return summary


def test_a_ray_run_in_a_worker_pod_logs_each_nodes_efa_bytes_from_its_counter_reader(full_run, storage):
    summary = assert_efa_bytes_in_steps_summary_and_tensorboard(full_run, storage / "full")
    assert "efa_line_rate_fraction" not in summary  # no --line-rate-gbps


def test_a_torchrun_run_with_a_fake_efa_tree_logs_each_nodes_efa_bytes(torchrun_run, storage):
    summary = assert_efa_bytes_in_steps_summary_and_tensorboard(torchrun_run, storage / "torchrun")
    assert summary["efa_line_rate_fraction"] == 0.0


def test_a_killed_worker_resumes_from_the_latest_checkpoint(storage, ray_head):
    """SIGKILL rank 0 after step 8 (from outside, as a node failure would); --max-failures 1
    restarts the worker group, which resumes from the newest checkpoint and finishes."""
    # The step-5 checkpoint is written behind the steps and committed at a later step K (which on a
    # loaded machine can come after step 8). It counts for a restart once Ray Train's controller
    # has taken its report: the report of step K+1 waits for that (a one-slot result queue per
    # worker that the controller's `poll_status` empties, ray 2.58:
    # ray/train/v2/_internal/execution/worker_group/worker.py), and rank 0 prints step K+2's line
    # after it returns. So the kill waits for step max(8, K+2); the steps after it only have
    # to outlast the kill's delivery.
    steps, checkpoint_every, kill_after = 16, 5, 8
    committed = re.compile(rf"checkpoint of step {checkpoint_every} committed at step (\d+)")
    command = [
        sys.executable, "-m", "training", *on_the_head(),
        "--steps", str(steps),
        "--checkpoint-every", str(checkpoint_every),
        "--max-failures", "1",
        "--storage-path", str(storage),
        "--run-name", "killed",
    ]  # fmt: skip
    stderr_path = storage / "killed-stderr.txt"
    lines: list[str] = []
    killed_pid, seen_commit = None, False
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**ray_head.env, "OMP_NUM_THREADS": "1"},
        )
        try:
            for line in process.stdout:
                lines.append(line)
                step = parse_step_line(line)
                if (commit := committed.search(line)) is not None:
                    kill_after = max(kill_after, int(commit.group(1)) + 2)
                    seen_commit = True
                if killed_pid is None and seen_commit and step is not None and step["step"] >= kill_after:
                    killed_pid = int(WORKER_PID.search(line).group(1))
                    os.kill(killed_pid, signal.SIGKILL)
            process.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert killed_pid is not None
    assert process.returncode == 0, stderr_path.read_text()[-4000:]

    reported = [entry for entry in map(parse_step_line, lines) if entry is not None]
    numbers = [entry["step"] for entry in reported]
    restart = next(index for index in range(1, len(numbers)) if numbers[index] <= numbers[index - 1])
    resumed_from = numbers[restart] - 1
    assert resumed_from >= checkpoint_every and resumed_from % checkpoint_every == 0, "".join(lines)
    assert f"resumed from step {resumed_from}" in "".join(lines)
    assert numbers[restart:] == list(range(resumed_from + 1, steps + 1))
    # Steps trained both before the kill and after the restart give the same losses.
    before = {entry["step"]: entry["loss"] for entry in reported[:restart]}
    replayed = [entry for entry in reported[restart:] if entry["step"] in before]
    assert replayed
    for entry in replayed:
        assert entry["loss"] == pytest.approx(before[entry["step"]], abs=1e-3), entry["step"]
    summary = printed_summary("".join(lines))
    assert (summary["steps"], summary["start_step"]) == (steps, resumed_from)


def test_a_diverging_run_exits_1_in_one_line_and_is_not_retried(tmp_path, ray_head):
    """At --lr 1e30 step 2 goes non-finite on both workers (its loss or its gradient norm, whichever
    the CPU's floating-point path overflows first): one line, exit 1, no step-2 checkpoint, and no
    retry from step 1's checkpoint despite --max-failures (it would diverge again)."""
    result = run_on_head(
        ray_head,
        "--data", "synthetic",
        "--lr", "1e30",
        "--warmup-steps", "0",
        "--steps", "3",
        "--checkpoint-every", "1",
        "--max-failures", "1",
        "--storage-path", str(tmp_path),
        "--run-name", "diverged",
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"training failed: step 2: the (loss|gradient norm) is (nan|-?inf); ", last), (
        result.stderr[-4000:]
    )
    assert "Lower --lr (this step's: 1e+30)" in last
    assert [step["step"] for step in step_lines(result.stdout)] == [1]
    assert [path.name for path in (tmp_path / "diverged").glob("checkpoint_0*")] == ["checkpoint_000001"]


# --- the best checkpoint kept, and early stopping ----------------------------------------------

# The tiny model trained hard on 8 conversations and evaluated on 40 others: the held-out loss falls
# for the first steps (it learns the template), then rises as it learns the 8 rows by heart (on this
# machine from 4.26 at step 15 to 5.3 at step 40, one rank of batch 4).
OVERFIT_FLAGS = (
    "--steps", "40", "--checkpoint-every", "5", "--batch-size", "4", "--lr", "1e-2",
    "--warmup-steps", "0", "--keep-checkpoints", "1", "--no-tensorboard",
)  # fmt: skip


@pytest.fixture(scope="module")
def overfit_data(tmp_path_factory) -> tuple[str, ...]:
    from examples.instruction_data import write_dataset

    root = tmp_path_factory.mktemp("overfit")
    write_dataset(root, train_rows=8, eval_rows=40, seed=0)
    return ("--data", str(root / "train.jsonl"), "--eval-data", str(root / "eval.jsonl"))


@pytest.fixture(scope="module")
def overfit_runs(storage, overfit_data, ray_head) -> dict[str, subprocess.CompletedProcess]:
    runs = {
        "ray": run_on_head(ray_head, *overfit_data, *OVERFIT_FLAGS, "--storage-path", str(storage), "--run-name", "overfit-ray"),
        "torchrun": run_cli(
            "--launcher", "torchrun", *overfit_data, *OVERFIT_FLAGS, "--storage-path", str(storage),
            "--run-name", "overfit-torchrun", launcher=TORCHRUN,
        ),
    }  # fmt: skip
    for result in runs.values():
        assert result.returncode == 0, result.stderr[-4000:]
    return runs


def evaluations(result: subprocess.CompletedProcess) -> dict[int, float]:
    return {
        entry["step"]: entry["eval_loss"]
        for entry in step_lines(result.stdout)
        if entry["eval_loss"] is not None
    }


@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_a_run_whose_eval_loss_rises_keeps_its_best_checkpoint_and_its_latest(
    overfit_runs, storage, launcher
):
    """--keep-checkpoints 1 with --eval-data: every checkpoint is evaluated; the one of lowest
    eval_loss is kept, and the latest (to resume from); the summary names the best. Only the two
    latest were kept before, so the best was deleted."""
    result = overfit_runs[launcher]
    evaluated = evaluations(result)
    assert sorted(evaluated) == list(range(5, 41, 5))  # at every checkpoint
    best = min(evaluated, key=evaluated.__getitem__)
    assert best < 40 and evaluated[40] > evaluated[best]  # the held-out loss rose after the best
    summary = printed_summary(result.stdout)
    assert (summary["best_eval_step"], summary["best_eval_loss"]) == (best, evaluated[best])
    kept = sorted(path.name for path in (storage / f"overfit-{launcher}").glob("checkpoint_0*"))
    assert kept == [f"checkpoint_{best:06d}", "checkpoint_000040"]
    state = json.loads(
        (storage / f"overfit-{launcher}" / f"checkpoint_{best:06d}" / "train_state.json").read_text()
    )
    assert (state["step"], state["eval_loss"]) == (best, evaluated[best])


def test_ray_and_torchrun_evaluate_alike(overfit_runs):
    on_ray, on_torchrun = evaluations(overfit_runs["ray"]), evaluations(overfit_runs["torchrun"])
    assert on_ray.keys() == on_torchrun.keys()
    for step, loss in on_ray.items():
        assert on_torchrun[step] == pytest.approx(loss, abs=1e-4), step


def test_early_stopping_ends_the_run_after_its_patience_with_a_checkpoint(
    overfit_runs, overfit_data, storage
):
    """--early-stop-patience 2: the run stops at the second evaluation in a row that is not below
    the best so far, the step the full run's evaluations say; that step has its checkpoint, the
    best is kept, and the summary says it stopped early."""
    full = evaluations(overfit_runs["torchrun"])
    best_loss, since, stop = float("inf"), 0, None
    for step, loss in sorted(full.items()):
        best_loss, since = (loss, 0) if loss < best_loss else (best_loss, since + 1)
        if since == 2:
            stop = step
            break
    assert stop is not None and stop < 40
    result = run_cli(
        "--launcher", "torchrun", *overfit_data, *OVERFIT_FLAGS, "--early-stop-patience", "2",
        "--storage-path", str(storage), "--run-name", "early-stop", launcher=TORCHRUN,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert [entry["step"] for entry in step_lines(result.stdout)] == list(range(1, stop + 1))
    summary = printed_summary(result.stdout)
    assert (summary["stopped_early"], summary["steps_run"], summary["steps"]) == (True, stop, 40)
    best = summary["best_eval_step"]
    assert f"stopping early at step {stop}: 2 evaluations without an eval_loss below" in result.stdout
    kept = sorted(path.name for path in (storage / "early-stop").glob("checkpoint_0*"))
    assert kept == [f"checkpoint_{best:06d}", f"checkpoint_{stop:06d}"]


def _deadline_in(seconds: float) -> tuple[str, float]:
    end = time.time() + seconds
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)), float(int(end))


def test_a_run_stops_before_its_deadline_with_a_checkpoint_and_the_next_resumes_from_it(storage):
    """--deadline two minutes away, far more steps than fit: exit 0 before it, the last step
    checkpointed (its Hugging Face export too); the same command with a later deadline resumes
    from there and trains on. Properties only, no timings: the margin is generous."""
    steps, run = 100_000, storage / "deadline"

    def run_until(seconds: float) -> tuple[subprocess.CompletedProcess, float, float]:
        deadline, end = _deadline_in(seconds)
        result = run_cli(
            "--local", "--steps", str(steps), "--export-hf", "--storage-path", str(storage),
            "--run-name", "deadline", "--deadline", deadline,
        )  # fmt: skip
        return result, time.time(), end

    first, ended, end = run_until(120)
    assert first.returncode == 0, first.stderr[-4000:]
    assert ended < end
    summary = printed_summary(first.stdout)
    last = summary["last_step"]
    assert summary["stopped_at_deadline"] is True and summary["deadline"]
    assert (summary["steps_run"], summary["steps_left"]) == (last, steps - last)
    assert summary["checkpoint_s"] > 0
    assert (run / f"checkpoint_{last:06d}" / "hf" / "model.safetensors").is_file()
    assert [line["step"] for line in step_lines(first.stdout)][-1] == last
    assert (
        "to deadline" in first.stdout and f"stopping at step {last} of {steps} for --deadline" in first.stdout
    )

    second, ended, end = run_until(120)
    assert second.returncode == 0, second.stderr[-4000:]
    assert ended < end
    assert f"resumed from step {last}" in second.stdout
    assert step_lines(second.stdout)[0]["step"] == last + 1
    resumed = printed_summary(second.stdout)
    assert resumed["start_step"] == last and resumed["last_step"] > last and resumed["stopped_at_deadline"]
