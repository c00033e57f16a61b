"""A run against its reservation's window: until when the GPUs may work, the run's deadline, and
whether the predicted run fits before it. Pure functions over dates and durations; `now` is
always given, never read here.

The usable end of a reservation:
- a Capacity Block: its `EndDate` less 40 minutes. EC2 begins terminating the block's instances
  30 minutes before its end (EC2 user guide, "Monitor Capacity Blocks using EventBridge": the
  expiration warning comes 40 minutes before the end and says the instances begin to terminate in
  10 minutes), and EKS gives a Capacity Block's managed node group a scheduled scaling action,
  "Amazon EKS Node Group Capacity Scaledown Before Reservation End", that sets it to 0 nodes 40
  minutes before the end, draining its pods (EKS user guide, "Create a managed node group with
  Capacity Blocks for ML");
- an On-Demand Capacity Reservation with an end date (`EndDateType` `limited`): its `EndDate`.
  A soft end: EC2 cancels the reservation within an hour after it (AWS::EC2::CapacityReservation,
  `EndDate`) and running instances go on at the On-Demand price, so the deadline stops the
  spending when the user meant it to stop rather than escaping a termination;
- none otherwise (`EndDateType` `unlimited`).

The run's deadline is the earlier of that end and the stack's `training.deadline`; the job gets it
as `--deadline` and stops before it with a checkpoint (`training.components.deadline`), by the
same margin this module predicts with (`training.config.deadline_margin`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from infra.aws_rules.capacity_rules import CAPACITY_BLOCK
from training.config.deadline_margin import WIND_DOWN_S, margin_s

# EKS scales a Capacity Block's node group to 0 this long before the block's end (see above).
CAPACITY_BLOCK_SCALEDOWN_LEAD = timedelta(minutes=40)

# --- the time from `pulumi up` to the job's first step, by phase: estimates, each with its basis --
# The EKS control plane, when the stack has no cluster yet: its creation averages 15 minutes
# (aws/containers-roadmap#1227, EKS's own figure).
CONTROL_PLANE_S = 15 * 60.0
# GPU instances launched, booted from the EKS accelerated AMI, joined, and their GPUs and EFA
# interfaces registered by the device plugins: an estimate of 5 minutes, when no GPU node of this
# cluster runs yet. Before a Capacity Block's start the launches wait for the start.
GPU_NODES_READY_S = 5 * 60.0
# The Ray image on each new GPU node: about 20 GB of layers (the AWS Deep Learning Container the
# stack runs), fetched and unpacked; estimated at 10 minutes, about 35 MB/s.
IMAGE_PULL_S = 10 * 60.0
# The fabric gate's probe job: about a minute on two g6.12xlarge (docs/operations/fabric-gate.md, "The fabric
# gate"), before every job.
FABRIC_GATE_S = 60.0


def parse_aws_time(text: str) -> datetime:
    """An AWS date (ISO 8601 with its offset, `2026-12-05T11:30:00Z` or `...:00.000Z`) in UTC."""
    return datetime.fromisoformat(text).astimezone(UTC)


def utc_text(moment: datetime) -> str:
    """The form `--deadline` takes and the messages show: `2026-12-05T10:50:00Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def usable_end(reservation_type: str | None, end_date: datetime | None) -> datetime | None:
    """Until when GPU work may go on in a reservation (see the module's docstring); None without an end."""
    if end_date is None:
        return None
    if reservation_type == CAPACITY_BLOCK:
        return end_date - CAPACITY_BLOCK_SCALEDOWN_LEAD
    return end_date


RESERVATION_KEY = "capacityReservationId"
DEADLINE_KEY = "training.deadline"


@dataclass(frozen=True)
class RunDeadline:
    """The run's deadline and the stack key it comes from (`RESERVATION_KEY` or `DEADLINE_KEY`)."""

    at: datetime
    key: str

    @property
    def text(self) -> str:
        return utc_text(self.at)


def run_deadline(reservation_end: datetime | None, configured: datetime | None) -> RunDeadline | None:
    """The earlier of the reservation's usable end and `training.deadline`; the reservation's on a tie."""
    if configured is not None and (reservation_end is None or configured < reservation_end):
        return RunDeadline(configured, DEADLINE_KEY)
    if reservation_end is not None:
        return RunDeadline(reservation_end, RESERVATION_KEY)
    return None


def seconds_until(moment: datetime, now: datetime) -> float:
    """Seconds from `now` to `moment`, 0 when it has passed."""
    return max(0.0, (moment - now).total_seconds())


# --- the predicted run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartUp:
    """Seconds from `pulumi up` to the job's first step, by phase; a phase already done is 0.
    `gpus_from`: when GPU instances may launch (a Capacity Block's start), None for at once."""

    control_plane_s: float
    gpu_nodes_s: float
    image_pull_s: float
    gate_s: float = FABRIC_GATE_S
    gpus_from: datetime | None = None

    def job_starts(self, now: datetime) -> datetime:
        """The control plane comes first; the GPU nodes launch once it exists and the block has begun."""
        launch = now + timedelta(seconds=self.control_plane_s)
        if self.gpus_from is not None and self.gpus_from > launch:
            launch = self.gpus_from
        return launch + timedelta(seconds=self.gpu_nodes_s + self.image_pull_s + self.gate_s)


def start_up(cluster_exists: bool, gpu_nodes_running: bool, gpus_from: datetime | None = None) -> StartUp:
    """The phases still ahead: no control plane for a cluster that exists, no node start nor image
    pull where this cluster's GPU nodes already run."""
    return StartUp(
        control_plane_s=0.0 if cluster_exists else CONTROL_PLANE_S,
        gpu_nodes_s=0.0 if gpu_nodes_running else GPU_NODES_READY_S,
        image_pull_s=0.0 if gpu_nodes_running else IMAGE_PULL_S,
        gpus_from=gpus_from,
    )


@dataclass(frozen=True)
class JobTimes:
    """The job's steps as the preview predicts them: `step_s` is the planner's step time (None
    without a forecast); checkpoints at the training side's estimate of their write (`checkpoint_s`),
    every `checkpoint_every` steps (0: only where the run ends) and at the end when `final_checkpoint`;
    an evaluation, where the job evaluates, takes a step's time, as the job itself assumes before it
    times one; `export_s` is the Hugging Face export written at the last step (0 without one)."""

    steps: int
    step_s: float | None
    checkpoint_s: float
    checkpoint_every: int = 0
    final_checkpoint: bool = False
    evaluates: bool = False
    eval_every: int = 0
    export_s: float = 0.0

    def checkpoints(self, steps: int, checkpoint: bool) -> int:
        """Checkpoints written by a run that ends after `steps` steps, with one at its end or not."""
        every = self.checkpoint_every
        before = (steps - 1) // every if every else 0
        return before + int(checkpoint)

    def eval_s(self, step_s: float) -> float:
        return step_s if self.evaluates else 0.0

    def through(self, steps: int, step_s: float) -> float:
        """Seconds of the first `steps` steps with the checkpoints and evaluations due among them."""
        every = self.checkpoint_every
        checkpoints = steps // every if every else 0
        evaluations = 0
        if self.evaluates:
            evals = self.eval_every
            both = math.lcm(every, evals) if every and evals else 0
            evaluations = checkpoints + (steps // evals if evals else 0) - (steps // both if both else 0)
        return steps * step_s + checkpoints * self.checkpoint_s + evaluations * step_s

    def ending_after(self, steps: int, step_s: float, checkpoint: bool) -> float:
        """Seconds of a run that ends after `steps` steps: the steps before the last with what they
        brought, the last with its evaluation, its checkpoint when one is written, the export and the
        run's wind-down."""
        last = step_s + self.eval_s(step_s) + (self.checkpoint_s if checkpoint else 0.0)
        return self.through(steps - 1, step_s) + last + self.export_s + WIND_DOWN_S

    def least_s(self) -> float:
        """The least time the job needs before its deadline once it starts: one step with its
        checkpoint (and what the last step brings: an evaluation, the export, the wind-down); without
        a step time, the job's own floor at its start, a checkpoint and the wind-down."""
        if self.step_s is None:
            return self.checkpoint_s + WIND_DOWN_S
        return self.ending_after(1, self.step_s, checkpoint=True)

    def margin_s(self, step_s: float) -> float:
        """What the job keeps back before its deadline once its steps take `step_s`."""
        return margin_s(
            checkpoint_s=self.checkpoint_s,
            slowest_step_s=step_s,
            eval_s=self.eval_s(step_s),
            export_s=self.export_s,
        )


def steps_that_fit(job: JobTimes, step_s: float, available_s: float) -> int:
    """The steps the job runs in `available_s`: by its own rule, step k + 1 starts only while the
    time after step k plus its margin stays within the deadline; the first always runs."""
    margin = job.margin_s(step_s)
    low, high = 1, job.steps  # the largest k in [1, steps] with k == 1 or through(k - 1) + margin fits
    while low < high:
        middle = (low + high + 1) // 2
        if job.through(middle - 1, step_s) + margin <= available_s:
            low = middle
        else:
            high = middle - 1
    return low


class Fit(Enum):
    FITS = "fits"
    PARTIAL = "partial"  # only some of the steps fit: the job stops at its deadline with a checkpoint
    REFUSED = "refused"  # not even one step with its checkpoint fits
    UNPREDICTED = "unpredicted"  # no step time to predict with; the job still stops at its deadline


@dataclass(frozen=True)
class WindowFit:
    """The predicted run against its deadline. `available_s`: from the job's first step to the
    deadline; `run_s`: the predicted job (None unpredicted); `steps`: the steps it runs."""

    outcome: Fit
    job_starts: datetime
    available_s: float
    run_s: float | None
    steps: int
    checkpoints: int = 0

    @property
    def spare_s(self) -> float | None:
        return None if self.run_s is None else self.available_s - self.run_s


def fit_window(job: JobTimes, start: StartUp, deadline: datetime, now: datetime) -> WindowFit:
    """Whether the job, started after `start`'s phases, ends before `deadline`."""
    begins = start.job_starts(now)
    available = (deadline - begins).total_seconds()
    if job.step_s is None:
        # The job's own refusal at its start: no room to checkpoint and wind down.
        outcome = Fit.REFUSED if available <= job.least_s() else Fit.UNPREDICTED
        return WindowFit(outcome, begins, available, None, 0)
    one = job.least_s()
    if available < one:
        return WindowFit(Fit.REFUSED, begins, available, one, 0, 1)
    steps = steps_that_fit(job, job.step_s, available)
    # Stopped at the deadline, the job checkpoints its last step whatever its cadence.
    checkpoint = steps < job.steps or job.final_checkpoint
    outcome = Fit.PARTIAL if steps < job.steps else Fit.FITS
    run_s = job.ending_after(steps, job.step_s, checkpoint)
    return WindowFit(outcome, begins, available, run_s, steps, job.checkpoints(steps, checkpoint))


# --- the same refusal at the run's own time ---------------------------------------------------------


@dataclass(frozen=True)
class DeadlineCheck:
    """The preview's refusal of a run that cannot fit, made again by the training run when it is about
    to run (`workloads.training_run.runner`), at its own time and before it scales or submits
    anything: only a run that really happens gets there, so a deadline that passed after a finished
    run stops nothing. `key` and `value`: the stack key the job's `--deadline` comes from
    (`DEADLINE_KEY` or `RESERVATION_KEY`) and its value; `fix`: what to change, as the preview words
    it; `least_s`: the least the run needs before its deadline from then on, the phases certain to be
    ahead of it (`least_before_deadline_s`)."""

    key: str
    value: str
    fix: str
    least_s: float


def least_before_deadline_s(job: JobTimes) -> float:
    """What a run needs before its deadline once its cluster is up, whatever else is still ahead (GPU
    nodes to launch, an image to pull): the fabric gate, then one step with its checkpoint."""
    return FABRIC_GATE_S + job.least_s()
