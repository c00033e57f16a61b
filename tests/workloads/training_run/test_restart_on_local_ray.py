"""A worker pod deleted mid-job, on a real local Ray: the job restarts from its checkpoint, succeeds,
and the TrainingRun reports the attempt.

A KubeRay worker pod is a Ray node (`ray start --address=<head> --block`), so the "pod" here is a
second raylet on this machine (`tests.harness.ray_head.worker_node`) holding every CPU the training
workers ask for; the head holds none, as the RayCluster's head holds no GPU. Deleting the pod with
its node gone is its raylet's whole process tree killed; KubeRay's replacement pod is a fresh raylet.
The job runs through the run's own commands (`runner.run_job`, as `local_job` does; the gate's probe
cannot pass on CPU, where gloo prints no NCCL line).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.harness.ray_head import running_head, stop_process_tree, worker_node
from tests.harness.training_run_fakes import run_inputs
from tests.workloads.training_run.test_runner import local_job, shipped_code
from workloads.training_run import attempts
from workloads.training_run.verdicts.evidence import JobResult

# The job's driver log reaches the run in batches, so the kill waits for the first checkpoint on disk
# instead: steps of about 0.2 to 0.7 s on this CPU leave the job most of its steps after it.
STEPS, CHECKPOINT_EVERY = 60, 5
WORKER_CPUS = 3  # two CPU workers and one for Ray Data's tasks, as `--local` sizes its embedded Ray


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="needs part A of issue 49 (restart in place): the run summary's `restarts` and `attempts` "
    "(training/components/attempts.py); flip this mark once it is merged",
)
def test_a_worker_pod_deleted_mid_job_ends_succeeded_after_one_restart_naming_it():
    with running_head(num_cpus=0) as head:
        code_dir, code_hash = shipped_code(head.root)
        job_args = (
            "--preset", "tiny",
            "--data", "synthetic",
            "--steps", str(STEPS),
            "--workers", "2",
            "--no-use-gpu",
            "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--max-failures", "2",
            "--storage-path", str(head.root / "runs"),
        )  # fmt: skip
        inputs = run_inputs(code_hash=code_hash, job_args=job_args, timeout_minutes=10)
        logged: list[str] = []
        result: list[JobResult | BaseException] = []

        def run() -> None:
            try:
                result.append(local_job(head, inputs, code_dir, logged))
            except BaseException as error:  # handed to the test's thread
                result.append(error)

        with worker_node(head, WORKER_CPUS) as pod:
            follower = threading.Thread(target=run, daemon=True)
            follower.start()
            deadline = time.monotonic() + 300
            while not any("checkpoint" in path.name for path in (head.root / "runs").rglob("*")):
                assert follower.is_alive() and time.monotonic() < deadline, logged[-5:]
                time.sleep(0.2)
            stop_process_tree(pod)  # the pod deleted, its node gone
        with worker_node(head, WORKER_CPUS):  # KubeRay's replacement pod
            follower.join(timeout=540)
        assert result, "the job did not end within 9 minutes of the restart"
        (job,) = result
        assert isinstance(job, JobResult), job
        assert job.status == "SUCCEEDED" and job.summary["steps"] == STEPS
        found = attempts.restarts_of(job.summary)
        assert found.restarts == 1
        (attempt,) = found.attempts or []
        assert attempt["attempt"] == 1 and attempt["cause"] and "\n" not in attempt["cause"]
        assert attempt["failed_after_step"] >= CHECKPOINT_EVERY
        assert attempt["resumed_from_step"] % CHECKPOINT_EVERY == 0
        assert 0 <= attempt["lost_steps"] <= 2 * CHECKPOINT_EVERY
        assert [line for line in logged if ": restart 1" in line] == [
            attempts.attempt_line(job.submission_id, attempt)
        ]
