"""How the verdict is reached: the job's logs, the NCCL lines in them, and the transport check.

Pods starting proves nothing: without the EFA device NCCL silently falls back to TCP sockets and
the job still completes, only slower. So after a job succeeds:

1. the driver's log (`JobLog`, fed as the job is polled) gives the step metrics, the run summary
   and any NCCL lines Ray relayed from the workers' stdout (none for a job submitted with
   `NCCL_DEBUG_FILE`: NCCL then writes to that file alone, NCCL src/debug.cc);
2. each worker pod's NCCL log files of *this* job are read: one per NCCL process, named after
   the submission id (`jobs.nccl_debug_file`), written line by line, so nothing is lost when Ray
   ends the worker. A job submitted before they existed has none: then the pod's Ray session logs
   are grepped for the job's NCCL lines instead: worker log files are named
   `worker-<worker id>-<ray job id>-<pid>.out|err` under `/tmp/ray/session_latest/logs`; other
   jobs' files never count. Ray's core worker rotates them by size (`RAY_ROTATION_MAX_BYTES`,
   default 512 MiB, `RAY_ROTATION_BACKUP_COUNT` parts kept, default 5) into
   `worker-...-<pid>.out.1`, `.out.2`, ... (seen with Ray 2.58): NCCL's init lines are in the
   oldest part of a long run, so the rotated parts are read too. A worker pod replaced since the
   job ran has lost its logs: only a job from before the NCCL log files has a relayed copy in the
   driver's log to stand in, so a newer one is judged on the pods that kept theirs (coverage then
   says what is missing);
3. `workloads.nccl_transport.classify_lines` turns all those lines into a `Verdict`, which must
   cover the job: NCCL lines telling the transport of every rank (`--workers` of the job) on
   every worker pod the ranks need (`expected_coverage`), else it is `unknown`;
4. `check_transport` fails `pulumi up` with the evidence when the transport is not the expected
   one. A command whose output may be incomplete (a cut exec stream) raises before any of this.
"""

from __future__ import annotations

import contextlib
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from training.metrics.report import parse_node_leaving_line, parse_step_line, parse_summary
from workloads.efa_counter_reader import READER_NAMESPACE
from workloads.nccl_transport import Verdict
from workloads.training_run.access.cluster_api import PodFacts, stdout_of_each_pod
from workloads.training_run.access.commands import CommandTimeout, Executor
from workloads.training_run.access.jobs import NCCL_LOG_DIR, JobRecord
from workloads.training_run.errors import TrainingRunError
from workloads.training_run.verdicts import efa_counters
from workloads.training_run.verdicts.efa_counters import EfaTraffic, MovedFloor

RAY_LOG_DIR = "/tmp/ray/session_latest/logs"
NCCL_LINES_PER_POD = 200_000
LOG_TAIL_LINES = 40

# Selects the Ray worker logs of one Ray job in a session log folder: `worker-<id>-<job>-<pid>`.
_JOB_LOG_FILES = """\
cd "$1" || exit 3
files=$(ls -1 | grep -E "^worker-[0-9a-f]+-$2-[0-9]+[.](out|err)([.][0-9]+)?$")
echo "log files: $(printf '%s\\n' $files | grep -c .)"
[ -n "$files" ] || exit 0
"""
LOG_TAIL_SCRIPT = _JOB_LOG_FILES + 'tail -q -n "$3" $(ls -1tr $files) | tail -n "$3"\n'
# The job's NCCL log files (`nccl-<submission id>.<host>.<pid>.log`), else its Ray worker logs.
NCCL_LINES_SCRIPT = (
    """\
files=$(cd "$1" 2>/dev/null && ls -1 | grep -E "^nccl-$2[.][^./]+[.][0-9]+[.]log$")
if [ -n "$files" ]; then
  cd "$1" || exit 3
  echo "log files: $(printf '%s\\n' $files | grep -c .) nccl"
  grep -h -F NCCL $files | head -n "$5"
  exit 0
fi
[ -n "$4" ] || { echo "log files: 0"; exit 0; }
set -- "$3" "$4" "$5"
"""
    + _JOB_LOG_FILES
    + 'grep -h -F NCCL $files | head -n "$3"\n'
)
_LOG_FILES_LINE = re.compile(r"log files: (\d+)( nccl)?")
RAY_JOB_ID = re.compile(r"[0-9a-f]+")  # fullmatch: it goes into a shell command
SUBMISSION_ID = re.compile(r"[a-z0-9-]+")  # fullmatch: it goes into a grep pattern


def nccl_lines_command(
    nccl_log_dir: str, submission_id: str, log_dir: str, ray_job_id: str | None
) -> list[str]:
    """The NCCL lines of a job on one pod: from its NCCL log files in `nccl_log_dir`, else (a job
    submitted without them) from the Ray worker logs of `ray_job_id` in `log_dir`."""
    if not SUBMISSION_ID.fullmatch(submission_id):
        raise ValueError(f"submission id {submission_id!r} is not of the form this program gives")
    args = [nccl_log_dir, submission_id, log_dir, ray_job_id or "", str(NCCL_LINES_PER_POD)]
    return ["sh", "-c", NCCL_LINES_SCRIPT, "sh", *args]


def log_tail_command(log_dir: str, ray_job_id: str) -> list[str]:
    return ["sh", "-c", LOG_TAIL_SCRIPT, "sh", log_dir, ray_job_id, str(LOG_TAIL_LINES)]


def expected_coverage(job_args: Sequence[str], gpus_per_node: int, worker_pods: int) -> tuple[int, int]:
    """(ranks, hosts) a verdict must cover: the job's `--workers` (without it, one per GPU of the
    worker pods, the training default), on as many worker pods as they fill, one rank per GPU."""
    workers = flag_value(job_args, "--workers")
    ranks = int(workers) if workers else gpus_per_node * worker_pods
    return ranks, min(worker_pods, -(-ranks // gpus_per_node))


def flag_value(job_args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` among the job's arguments (`--flag value` or `--flag=value`; the last one
    given, as its parser takes it); None without one."""
    found = None
    for index, arg in enumerate(job_args):
        if arg == flag and index + 1 < len(job_args):
            found = job_args[index + 1]
        elif arg.startswith(f"{flag}="):
            found = arg.partition("=")[2]
    return found


@dataclass(frozen=True)
class PodLogs:
    """What a log script read in one pod: how many files, whether NCCL's own, and their lines."""

    files: int
    nccl_files: bool
    lines: list[str]


def split_log_listing(stdout: str) -> PodLogs:
    """The log files count line, then the lines, from the output of the log scripts."""
    lines = stdout.splitlines()
    if lines and (match := _LOG_FILES_LINE.fullmatch(lines[0])):
        return PodLogs(int(match.group(1)), bool(match.group(2)), lines[1:])
    return PodLogs(0, False, lines)


class JobLog:
    """The driver's log as it arrives: step metrics, NCCL lines relayed by Ray, the nodes the job
    asks to take out (rank 0's NODE_LEAVING lines, relayed by Ray with its worker tag in front:
    `training.metrics.report.parse_node_leaving_line`), and the tail."""

    TAIL_LINES = 200  # the summary is the last line the driver prints, Ray's shutdown lines may follow

    def __init__(self) -> None:
        self._partial = ""
        self.tail: deque[str] = deque(maxlen=self.TAIL_LINES)
        self.nccl_lines: list[str] = []
        self.steps: list[dict] = []
        self.leaving_nodes: list[str] = []  # in the order asked, as often as asked

    def feed(self, text: str) -> list[dict]:
        """Take new log text; returns the step metrics it completed."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return [step for line in lines if (step := self._take(line)) is not None]

    def close(self) -> list[dict]:
        """The last line may lack its newline."""
        rest, self._partial = self._partial, ""
        step = self._take(rest) if rest else None
        return [step] if step else []

    def _take(self, line: str) -> dict | None:
        self.tail.append(line)
        if "NCCL" in line and len(self.nccl_lines) < NCCL_LINES_PER_POD:
            self.nccl_lines.append(line)
        if (node := parse_node_leaving_line(line)) is not None:
            self.leaving_nodes.append(node)
        step = parse_step_line(line)
        if step is not None:
            self.steps.append(step)
        return step

    def summary(self) -> dict | None:
        return parse_summary("\n".join(self.tail))

    def last_lines(self, count: int = LOG_TAIL_LINES) -> list[str]:
        return list(self.tail)[-count:]


@dataclass
class JobResult:
    """One finished, successful job and what its logs say: the training job (`summary` its run
    summary) or the gate's probe (`summary` its JSON report)."""

    submission_id: str
    status: str
    summary: dict
    verdict: Verdict
    log_files: dict[str, int] = field(default_factory=dict)
    rejudged: str | None = None  # why an earlier run's succeeded job was judged again
    efa: EfaTraffic | None = None  # each worker node's EFA counters around the job (`efa_counters`)


def worker_logs(
    workers: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor], argv: list[str], log_dir: str
) -> dict[str, PodLogs]:
    """Run a log script on every worker pod: pod name -> what it read."""
    listings = stdout_of_each_pod(workers, executor_for, argv, f"the Ray logs in {log_dir}")
    return {name: split_log_listing(stdout) for name, stdout in listings.items()}


def _indent(lines: Sequence[str]) -> str:
    return "\n".join(f"    {line}" for line in lines) if lines else "    (empty)"


def failure_report(
    job: JobRecord,
    log: JobLog,
    workers: Sequence[PodFacts],
    executor_for: Callable[[PodFacts], Executor],
    log_dir: str,
) -> str:
    """What a failed or stopped job left: Ray's reason, the driver's tail, each worker's tail."""
    # Ray's message repeats the log's tail after its first line; the tail follows anyway.
    reason = job.message.strip().splitlines()[0] if job.message and job.message.strip() else None
    parts = [f"job {job.submission_id} {job.status}" + (f": {reason}" if reason else "")]
    parts.append("last lines of the driver log:\n" + _indent(log.last_lines()))
    ray_job_id = job.ray_job_id if job.ray_job_id and RAY_JOB_ID.fullmatch(job.ray_job_id) else None
    if ray_job_id:
        # The job's failure is the news: a worker pod that cannot be read must not hide it.
        with contextlib.suppress(TrainingRunError, CommandTimeout):
            tails = worker_logs(workers, executor_for, log_tail_command(log_dir, ray_job_id), log_dir)
            for pod, read in tails.items():
                if read.lines:
                    parts.append(
                        f"last lines of the job's {read.files} worker log files on {pod}:\n"
                        + _indent(read.lines)
                    )
    return "\n".join(parts)


def counter_problems(result: JobResult, expect: str, floor: MovedFloor) -> list[str]:
    """What the EFA counters around a job say against `expect` (`efa_counters.counter_problems`)."""
    if result.efa is None:
        return ["the EFA counters around the job were not read"]
    return efa_counters.counter_problems(result.efa, expect, floor)


def check_transport(result: JobResult, expect: str, floor: MovedFloor | None) -> None:
    """Fail with the evidence when NCCL did not use the expected transport; or, with a counter
    `floor` (None: the counter check is off), when EFA was expected and a worker node's EFA counters
    could not be read or moved less, or a TCP run's moved at least that much."""
    verdict = result.verdict
    if verdict.ok(expect):
        if floor is not None and (problems := counter_problems(result, expect, floor)):
            moved = result.efa.bytes_moved() if result.efa is not None else None
            raise TrainingRunError(
                f"NCCL's log says it used '{expect}' (job {result.submission_id}), but the EFA hardware "
                f"counters of the worker nodes do not show it:\n"
                + _indent(problems)
                + f"\nEFA bytes per worker pod during the job: {moved}. "
                + (
                    "Check that each worker pod requests vpc.amazonaws.com/efa and that its node's EFA devices "
                    "are up (`fi_info -p efa` in the worker pod)"
                    if expect == "efa"
                    else "Stop whatever else uses EFA on the GPU nodes during the benchmark"
                )
                + f"; for counters that could not be read, check the reader pods (`kubectl -n {READER_NAMESPACE} "
                "get pods -o wide`) or set training.checkEfaCounters to false"
                + (f"\nnote: {result.rejudged}" if result.rejudged else "")
            )
        return
    evidence = _indent(verdict.evidence) if verdict.evidence else "    (no line decided it)"
    raise TrainingRunError(
        f"NCCL used '{verdict.transport}' between the nodes, not '{expect}' (job {result.submission_id}, "
        f"{verdict.confidence} confidence): {verdict.reason}\n"
        f"evidence:\n{evidence}\n"
        f"worker log files read: {result.log_files or 'none (the job has no Ray job id or no worker pods)'}\n"
        "check that the worker pods request vpc.amazonaws.com/efa and set FI_PROVIDER=efa and "
        "NCCL_NET_PLUGIN=ofi, and look for 'NET/OFI' lines in the job's NCCL log files on the worker "
        f"pods ({NCCL_LOG_DIR}/nccl-{result.submission_id}.*.log, or {RAY_LOG_DIR}/worker-*.out for a job "
        "submitted without them): they say why aws-ofi-nccl did not load"
        + (f"\nnote: {result.rejudged}" if result.rejudged else "")
    )
