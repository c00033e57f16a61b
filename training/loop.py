"""The training loop, the same under Ray Train and torchrun: the run around each optimizer step
(`training.step.train_step`): `train` resumes, runs the steps, then sums up; `_Steps` holds what
each step uses: the data, evaluation, checkpoints, the stops and the logs.

It talks to its launcher only through a `Session` (training/session.py), builds the model with
training/build.py and checks a resume with training/components/resume.py. What a step evaluates,
checkpoints and whether it ends the run is one decision of `training.components.cadence`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from training.build import build
from training.components.async_checkpoint import CheckpointWriter
from training.components.attempts import Restarts
from training.components.cadence import Cadence, Decision, Signals
from training.components.checkpoint import load_checkpoint, load_weights, read_train_state
from training.components.deadline import Deadline
from training.components.drain import DrainWatch, notice_line
from training.components.evaluate import best_evaluation, eval_batches, evaluate
from training.components.optim import learning_rate
from training.components.resume import (
    CheckpointContents,
    check_resume,
    check_same_architecture,
    checkpoint_settings,
    recorded_global_batch,
)
from training.components.watchdog import COMMIT, EVALUATION, LAST_CHECKPOINT, HangWatchdog
from training.config.drain_budget import DrainChoice
from training.config.run_config import TrainConfig
from training.data.batches import position_after, step_batches
from training.data.packing import PackedCorpus, PackingStats
from training.distributed.ballot import StepBallot
from training.errors import DivergedError, UsageError
from training.metrics.cloudwatch_sink import publish_restart, publish_step
from training.metrics.efa_meter import EfaMeter
from training.metrics.flops import num_params
from training.metrics.report import RunSummary, StepMetrics, format_progress_line, format_step_line
from training.metrics.run_metrics import RunMetrics
from training.metrics.tensorboard_sink import TensorBoardSink
from training.model.causal_lm import CausalLMWithFusedLoss, model_batch
from training.session import Session, emit
from training.step import train_step

HISTORY_KEYS = ("step", "loss", "lr", "grad_norm", "eval_loss", "tokens_per_s", "step_time_s")


def _eval_set(config: TrainConfig, session: Session) -> tuple[list[np.ndarray], PackingStats | None]:
    held_out = session.eval_rows(config)
    rows, packing = (
        (held_out.rows, held_out.packing) if isinstance(held_out, PackedCorpus) else (held_out, None)
    )
    try:
        batches = eval_batches(
            rows, rank=session.rank, world_size=session.world_size, batch_size=config.batch_size
        )
    except ValueError as error:
        raise UsageError(f"--eval-data {config.eval_data}: {error}") from None
    return batches, packing


def _silent(line: str) -> None:
    """A rank other than 0 prints none of the run's lines."""


def _packing(
    config: TrainConfig, rank: int, stats: dict[str, PackingStats | None]
) -> dict[str, dict[str, int]] | None:
    """The summary's packing counts by corpus ("data", "eval_data"; none for synthetic tokens or a
    session that gives bare rows); rank 0 logs what packing truncated."""
    flags = {"data": ("--data", config.data), "eval_data": ("--eval-data", str(config.eval_data))}
    known = {name: counts for name, counts in stats.items() if counts is not None}
    for name, counts in known.items():
        if rank == 0 and (line := truncation_line(*flags[name], counts, config.seq_len)):
            emit(line)
    return {name: dataclasses.asdict(counts) for name, counts in known.items()} or None


def truncation_line(flag: str, data: str, packing: PackingStats, seq_len: int) -> str | None:
    """What packing cut, for the log: None when no document was longer than a row."""
    if not packing.documents_truncated:
        return None
    return (
        f"{flag} {data}: {packing.documents_truncated:,} conversations of {packing.documents:,} documents "
        f"longer than a row of {seq_len + 1} tokens, truncated to it ({packing.tokens_truncated:,} tokens "
        "dropped)"
    )


def _prepare_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _corpus(config: TrainConfig, session: Session) -> PackedCorpus | None:
    """The packed corpus (None for synthetic data)."""
    return None if config.synthetic_data else session.corpus(config)


def early_stop_line(step: int, history: list[dict[str, Any]], patience: int) -> str:
    best = best_evaluation(history)
    assert best is not None
    return (
        f"stopping early at step {step}: {patience} evaluations without an eval_loss below "
        f"{best[1]:.4f} (step {best[0]}; --early-stop-patience {patience})"
    )


def deadline_line(step: int, steps: int, deadline: Deadline) -> str:
    return (
        f"stopping at step {step} of {steps} for --deadline {deadline.deadline} "
        f"({deadline.left_s():.0f} s left; kept back: {deadline.margin_s():.0f} s for a step, its "
        f"checkpoint ({deadline.checkpoint_s:.1f} s, {'measured' if deadline.checkpoint_measured else 'estimated'}), "
        "evaluation and export where the run has them, and the run's end)"
    )


@dataclasses.dataclass
class _Start:
    """Where this attempt starts: the built model and optimizer, and what a resume restored."""

    model: CausalLMWithFusedLoss
    optimizer: torch.optim.Optimizer
    architecture: Any
    replicas: int
    corpus: PackedCorpus | None
    settings: dict[str, Any]
    step: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    position: tuple[int, int] = (0, 0)  # in the corpus's epochs (`position_after`)
    resharded: bool = False


def _resume(config: TrainConfig, session: Session) -> _Start:
    """Build, then resume from the session's latest checkpoint when there is one (checked first:
    `check_resume`), else take --init-from's weights when given."""
    with session.latest_checkpoint() as checkpoint_path:
        model, optimizer, architecture, replicas = build(
            config, session, resuming=checkpoint_path is not None
        )
        corpus = _corpus(config, session)
        settings = checkpoint_settings(
            config, session.world_size, "synthetic" if corpus is None else corpus.fingerprint
        )
        start = _Start(model, optimizer, architecture, replicas, corpus, settings)
        if checkpoint_path is not None:
            state = read_train_state(checkpoint_path)
            check_resume(state, settings, config.steps, checkpoint_path)
            load_checkpoint(checkpoint_path, model, optimizer)
            start.step, start.history = state["step"], state["history"]
            saved_world = state.get("world_size", session.world_size)
            start.resharded = saved_world != session.world_size
            if corpus is not None:
                # Checkpoints older than the saved position consumed step x global batch rows.
                saved_position = state.get("data_position")
                start.position = (
                    (saved_position[0], saved_position[1])
                    if saved_position is not None
                    else position_after(
                        (0, 0),
                        start.step,
                        rows=len(corpus.rows),
                        global_batch=recorded_global_batch(state) or settings["global_batch"],
                    )
                )
            if session.rank == 0:
                moved = (
                    f", resharded from {saved_world} workers to {session.world_size}"
                    if start.resharded
                    else ""
                )
                emit(f"resumed from step {start.step} ({checkpoint_path}){moved}")
    if checkpoint_path is None and config.init_from is not None:
        with session.open_checkpoint(config.init_from) as weights_path:
            check_same_architecture(read_train_state(weights_path), architecture, config.init_from)
            load_weights(weights_path, model)
        if session.rank == 0:
            emit(f"initialised from the weights of {config.init_from}; optimizer and step counter fresh")
    return start


def _deadline(config: TrainConfig, architecture: Any, device: torch.device) -> Deadline | None:
    """--deadline's clock, checked on every rank before the first step (collective)."""
    if config.deadline is None:
        return None
    deadline = Deadline(
        config.deadline,
        num_params(architecture),
        evaluates=config.eval_data is not None,
        export_dtype=config.export_dtype if config.export_hf else None,
    )
    deadline.check_start(device)
    return deadline


class _Steps:
    """What the steps of one attempt use, built before the first: the batches, the held-out set,
    the metrics and their sinks, the deadline, the drain watch, the hang watchdog, the checkpoint
    writer, the step's ballot and the cadence; `run(step)` is one step, its end included."""

    def __init__(self, config: TrainConfig, session: Session, start: _Start, restarts: Restarts) -> None:
        self.config, self.session, self.start, self.restarts = config, session, start, restarts
        self.model, self.optimizer, corpus = start.model, start.optimizer, start.corpus
        rows = None if corpus is None else corpus.rows
        self.history = start.history
        self.contents = CheckpointContents(
            self.model,
            self.optimizer,
            start.architecture,
            start.settings,
            self.history,
            start.step,
            start.position,
            None if rows is None else len(rows),
            config.tokenizer,
            config.export_dtype if config.export_hf else None,
            session.rank,
        )
        vocab_size = start.architecture.vocab_size
        self.batches = step_batches(config, session, vocab_size, start.step, rows, start.position)
        self.held_out, eval_packing = (
            _eval_set(config, session) if config.eval_data is not None else ([], None)
        )
        counts = {"data": corpus and corpus.packing, "eval_data": eval_packing}
        self.packing = _packing(config, session.rank, counts)
        self.metrics = RunMetrics(config, start.architecture, session.device, session.world_size, start.step)
        # A resumed run drops the events past its checkpoint that the run before wrote, so its curves
        # do not double back.
        purge_step = start.step + 1 if start.step else None
        self.sink = TensorBoardSink(config, purge_step) if config.tensorboard and session.rank == 0 else None
        self.meter = EfaMeter.start(session.device)  # None on every rank without EFA ports
        self.deadline = _deadline(config, start.architecture, session.device)
        self.drain = DrainWatch(session.preemption_notice)
        self.watchdog = HangWatchdog.start(
            session.rank, session.world_size, config.hang_margin_s, emit, session.note_hang
        )
        self.checkpoints = CheckpointWriter(
            session,
            self.model,
            self.optimizer,
            config.checkpoint_interval_s,
            session.device,
            log=emit if session.rank == 0 else None,
            committed_step=start.step,
        )
        self.ballot = StepBallot()
        for component in (self.checkpoints, self.drain, self.deadline):
            if component is not None:
                component.register(self.ballot)
        self.cadence = Cadence(config, self.history)
        self.checkpoint_s: float | None = None  # the last checkpoint's, as the summary gives it

    def run(self, step: int) -> Decision:
        """One step: train, agree on the drain and the cadence's decision, evaluate, log, report
        and checkpoint."""
        config, session, checkpoints = self.config, self.session, self.checkpoints
        step_start = time.perf_counter()
        if self.deadline is not None:
            self.deadline.start_step()
        micro_batches = [
            model_batch(next(self.batches), session.device) for _ in range(config.grad_accum_steps)
        ]
        lr = learning_rate(config, step)
        checkpoints.cast(self.ballot)
        self.drain.cast(self.ballot)  # the drain's votes ride on the same all-reduce
        with self.watchdog.step(step):
            loss, grad_norm = train_step(
                self.model,
                self.optimizer,
                micro_batches,
                lr,
                config.max_grad_norm,
                config.defer_grad_sync,
                step=step,
                ballot=self.ballot,
                deadline=self.deadline,
            )
        checkpoints.count(self.ballot)
        self.drain.count(self.ballot)
        step_time = time.perf_counter() - step_start
        drained = self.drain.decide()  # the same on every rank: a notice to act on at this step
        in_flight_step = checkpoints.pending.step if checkpoints.pending is not None else None
        # What can commit before the notice's deadline, agreed by every rank (collective).
        notice = self.drain.notice
        choice = checkpoints.drain(notice.deadline, time.time()) if drained and notice else None
        signals = Signals(
            # Every rank's vote was summed in the step's all-reduce: all stop after this step.
            deadline_stop=self.deadline is not None and Deadline.agreed(self.ballot),
            drained=drained,
            drain_write=choice is not None and choice.write,
            interval_due=checkpoints.interval_due,
        )
        eval_s: list[float] = []
        decision = self.cadence.decide(step, signals, lambda: self._evaluate(step, eval_s))
        record = self.metrics.step(
            step,
            loss,
            step_time,
            sum(batch.loss_tokens for batch in micro_batches),
            sum(batch.attended_pairs for batch in micro_batches),
            lr=lr,
            grad_norm=grad_norm,
            eval_loss=decision.eval_loss,
            efa=self.meter.sample() if self.meter is not None else None,
        )
        self.history.append({key: getattr(record, key) for key in HISTORY_KEYS})
        if session.rank == 0:
            self._log(step, record, decision, choice, in_flight_step)
        self._report(step, record, decision, choice)
        if self.deadline is not None:
            self.deadline.record(
                iteration_s=time.perf_counter() - step_start,
                eval_s=eval_s[0] if eval_s else None,
                # A write behind the steps is no measure of the synchronous one the deadline's is.
                checkpoint_s=self.checkpoint_s if decision.checkpoint and decision.last else None,
            )
        return decision

    def _evaluate(self, step: int, took_s: list[float]) -> float:
        """The held-out loss (collective), its seconds appended to `took_s`."""
        eval_start = time.perf_counter()
        with self.watchdog.watch(EVALUATION, step):
            eval_loss = evaluate(self.model, self.held_out, self.session.device)
        took_s.append(time.perf_counter() - eval_start)
        return eval_loss

    def _log(
        self,
        step: int,
        record: StepMetrics,
        decision: Decision,
        choice: DrainChoice | None,
        in_flight_step: int | None,
    ) -> None:
        """Rank 0's lines of a step, its restart and step metrics to CloudWatch."""
        config, deadline, checkpoints = self.config, self.deadline, self.checkpoints
        emit(format_progress_line(record, deadline_left_s=None if deadline is None else deadline.left_s()))
        emit(format_step_line(record))
        start = self.start.step
        if step == start + 1 and (attempt := self.restarts.first_step(start, time.time(), emit)):
            publish_restart(config, attempt["lost_steps"])  # before the last step's closes the sink
        publish_step(config, record)  # CloudWatch, off the training thread
        if decision.stopped_early:
            emit(early_stop_line(step, self.history, config.early_stop_patience))
        if decision.stopped_at_deadline and deadline is not None:
            emit(deadline_line(step, config.steps, deadline))
        if choice is not None and self.drain.notice is not None:
            line = notice_line(
                self.drain.notice,
                step,
                time.time(),
                choice,
                in_flight_step=in_flight_step,
                write_s=checkpoints.next_write_s(),
                committed_step=checkpoints.committed_step,
            )
            emit(line)

    def _report(self, step: int, record: StepMetrics, decision: Decision, choice: DrainChoice | None) -> None:
        """The step's events and its report through the checkpoint writer: the checkpoint the
        decision makes due (written behind the next steps, or synchronously at the last step)."""
        due, last, eval_loss = decision.checkpoint, decision.last, decision.eval_loss
        if self.sink is not None:
            self.sink.write(record)
            if due:
                self.sink.sync()
        # The checkpoint's time is its write to the run's storage; one
        # before the last is written behind the next steps, and this is its stall.
        report_start = time.perf_counter()
        # A commit may wait for the write in flight, or write the last checkpoint: a write's time is allowed.
        write_s = self.checkpoints.next_write_s() if due or choice is not None else 0.0
        with self.watchdog.watch(LAST_CHECKPOINT if last else COMMIT, step, allowance_s=write_s):
            self.checkpoints.report(
                record.as_dict(),
                step,
                state=self.contents.train_state(step, eval_loss) if due and not last else None,
                last=last,
                save=self.contents.saver(step, eval_loss, last) if due and last else None,
                commit_in_flight=choice is not None and choice.commit_in_flight,
            )
        if due:
            self.checkpoint_s = time.perf_counter() - report_start

    def commit_in_flight(self, step: int) -> None:
        """At a step that diverged: the last good step's checkpoint, when one is being written."""
        with self.watchdog.watch(COMMIT, step, allowance_s=self.checkpoints.next_write_s()):
            self.checkpoints.commit_in_flight()

    def close(self) -> None:
        self.watchdog.stop()
        self.checkpoints.close()
        # Also when a step diverges: its events up to there are what explains it.
        if self.sink is not None:
            self.sink.close()


def train(config: TrainConfig, session: Session) -> RunSummary:
    """Build, resume if a checkpoint exists (or take --init-from's weights), train up to
    config.steps (or until the held-out loss stops improving, or --deadline), hand the summary
    to the session."""
    _prepare_device(session.device)
    restarts = Restarts.begin(session.faults(), config, session.nodes())
    restarts.wait(session.preemption_notice, emit if session.rank == 0 else _silent, time.sleep, time.time)
    start = _resume(config, session)
    steps = _Steps(config, session, start, restarts)
    step, decision = start.step, None
    try:
        for step in range(start.step + 1, config.steps + 1):
            decision = steps.run(step)
            if decision.stopped_early or decision.stopped_at_deadline:
                break
    except DivergedError:
        steps.commit_in_flight(step)
        raise
    finally:
        steps.close()
    summary = _summary(config, steps, step, decision)
    session.finish(summary.as_dict(), steps.history)
    return summary


def _summary(config: TrainConfig, steps: _Steps, step: int, decision: Decision | None) -> RunSummary:
    """The run's summary (collective): the metrics', and how and where the run ended."""
    best = best_evaluation(steps.history)
    return dataclasses.replace(
        steps.metrics.summary(steps.start.replicas, resharded=steps.start.resharded),
        stopped_early=decision is not None and decision.stopped_early,
        best_eval_step=None if best is None else best[0],
        best_eval_loss=None if best is None else best[1],
        packing=steps.packing,
        checkpoint_s=steps.checkpoint_s,
        deadline=config.deadline,
        stopped_at_deadline=decision is not None and decision.stopped_at_deadline,
        last_step=step,
        steps_left=config.steps - step,
        **steps.restarts.summary_fields(),
    )
