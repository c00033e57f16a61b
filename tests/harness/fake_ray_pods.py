"""The commands the TrainingRun provider execs in the Ray head and worker pods (`FakeRayPods`), and
what those pods leave behind.

- NCCL's own log files (`NCCL_DEBUG_FILE`, one per process, line-buffered; NCCL src/debug.cc): a
  scripted job with `nccl_lines_of` writes them into each worker pod's `/tmp/ray` when submitted,
  from the lines of a fixture job's processes on that pod, as the real processes would while running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from tests.harness.fake_kube_api import ExecReply
from tests.harness.fake_ray_dashboard import FakeRayDashboard, ScriptedJob
from tests.harness.ray_head import token_auth_env
from workloads.training_run.readiness import host_limits_command

# What `readiness.HOST_LIMITS_SCRIPT` reads in a GPU worker pod on the EKS AL2023 NVIDIA AMI: its
# default driver branch is 580 (amazon-eks-ami issue 2470; nvidia-smi's header then says CUDA 13.0),
# the AWS DLC's PyTorch 2.13 is built for CUDA 13.0, and the locked-memory limit is the one AWS's EFA
# guide asks for (unlimited; what a given AMI release's containerd gives is not checked here).
HEALTHY_HOST_LIMITS = "driver 580.95.05\ndriver_cuda 13.0\nruntime_cuda 13.0\nmemlock unlimited\n"


def write_nccl_log_files(
    session_logs: Path, nccl_dir: Path, pod_name: str, submission_id: str, ray_job_id: str
) -> None:
    """What a job submitted with `NCCL_DEBUG_FILE` leaves in a worker pod's `/tmp/ray`: one file per
    NCCL process, `nccl-<submission id>.<host>.<pid>.log` (NCCL src/debug.cc: %h is the host name up
    to its first dot, the pod's name; %p the pid), holding the NCCL lines that the fixture job
    `ray_job_id`'s processes on this pod wrote to their Ray worker logs."""
    nccl_dir.mkdir(parents=True, exist_ok=True)
    for out in sorted(session_logs.glob(f"worker-*-{ray_job_id}-*.out")):
        pid = out.name.rsplit("-", 1)[1].split(".")[0]
        lines = [line for line in out.read_text().splitlines(keepends=True) if "NCCL" in line]
        (nccl_dir / f"nccl-{submission_id}.{pod_name}.{pid}.log").write_text("".join(lines))


@dataclass
class FakeRayPods:
    """Answers the commands the provider execs: the head's, against `dashboard`; the workers' over fixture logs.

    `head_jobs_api` really runs (this Python, as the image's would), `sh` log scripts really run over
    the fixture session folders; `ray job submit` is recorded and turned into a scripted job.
    """

    dashboard: FakeRayDashboard
    head_pod: str
    worker_logs: dict[str, Path]  # worker pod -> its Ray session log folder
    code_hash: str
    job_for_submission: Callable[[list[str]], ScriptedJob]
    efa: dict[str, FakeEfaSysfs] = field(default_factory=dict)  # node -> its EFA sysfs
    node_of: dict[str, str] = field(default_factory=dict)  # worker and reader pod -> its node
    # The head pod's emptyDir `/tmp/ray`, where the TrainingRun keeps its records of each job.
    head_tmp: Path | None = None
    host_limits: str = HEALTHY_HOST_LIMITS  # what each worker pod's node gives it (`HEALTHY_HOST_LIMITS`)
    # Worker pod -> its emptyDir `/tmp/ray`, where NCCL log files go (default: above its session logs).
    nccl_logs: dict[str, Path] = field(default_factory=dict)
    submissions: list[list[str]] = field(default_factory=list)
    probe_submissions: list[list[str]] = field(default_factory=list)

    def nccl_dir(self, pod_name: str) -> Path:
        return self.nccl_logs.get(pod_name, self.worker_logs[pod_name].parent)

    @staticmethod
    def _not_found(executable: str) -> ExecReply:
        """A command whose executable the container's image lacks, as containerd words it."""
        return ExecReply(
            not_started=(
                "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: "
                f'unable to start container process: exec: "{executable}": executable file not found in $PATH: unknown'
            )
        )

    def __call__(self, pod_name: str, container: str, argv: list[str]) -> ExecReply:
        if pod_name == self.head_pod:
            if argv[0] == "cat":
                return ExecReply(self.code_hash + "\n")
            if argv[:3] == ["ray", "job", "submit"]:
                submission_id = argv[argv.index("--submission-id") + 1]
                if submission_id in self.dashboard.jobs:
                    return ExecReply("", f"Job with submission_id {submission_id} already exists.", 1)
                job = self.job_for_submission(argv)
                if "--metadata-json" in argv:
                    job.metadata = json.loads(argv[argv.index("--metadata-json") + 1])
                self.dashboard.jobs[submission_id] = job
                probe = "training.fabric_probe" in argv  # the gate's probe before a job, kept apart
                (self.probe_submissions if probe else self.submissions).append(argv)
                for sysfs in self.efa.values():
                    sysfs.add(job.efa_traffic)
                if job.nccl_lines_of is not None:
                    assert self.nccl_logs, "give nccl_logs: a scripted job never writes into the fixtures"
                    for pod_name, logs in self.worker_logs.items():
                        write_nccl_log_files(
                            logs, self.nccl_dir(pod_name), pod_name, submission_id, job.nccl_lines_of
                        )
                return ExecReply(f"Job '{submission_id}' submitted successfully\n")
            if argv[:2] == ["python", "-c"]:
                command = [sys.executable, "-c", argv[2], self.dashboard.url, *argv[4:]]
                # In the head's Ray container environment: the token KubeRay sets from its Secret.
                outside = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
                return _run(command, env={**outside, **token_auth_env(self.dashboard.token)})
            if argv[0] == "sh" and self.head_tmp is not None:
                return _run([arg.replace("/tmp/ray/", f"{self.head_tmp}/") for arg in argv])
            return self._not_found(argv[0])
        node = self.efa.get(self.node_of.get(pod_name, ""))
        if pod_name not in self.worker_logs:  # a reader pod: the host's view of its node's sysfs
            assert argv[:2] == ["python", "-c"], argv
            local = {"/sys/class/infiniband": str(node.root) if node else "/nonexistent"}
            return _run([sys.executable, *(local.get(arg, arg) for arg in argv[1:])])
        if argv == host_limits_command():
            return ExecReply(self.host_limits)
        logs = self.worker_logs[pod_name]
        # The pod's emptyDir /tmp/ray (NCCL log files) is the folder above its session logs; its sysfs
        # shows the node's EFA device as a compat device, without counters.
        local = {"/tmp/ray/session_latest/logs": str(logs), "/tmp/ray": str(self.nccl_dir(pod_name))}
        if node is not None:
            local["/sys/class/infiniband"] = str(node.pod_view)
        return _run([local.get(arg, arg) for arg in argv])


def _run(argv: list[str], env: dict[str, str] | None = None) -> ExecReply:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    return ExecReply(done.stdout, done.stderr, done.returncode)
