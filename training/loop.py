"""The training loop, the same under Ray Train and torchrun: one optimizer step (`train_step`) and
the run around it (`train`: resume, the steps, evaluation, checkpoints, the stops and the summary).

It talks to its launcher only through a `Session` (training/session.py), builds the model with
training/build.py and checks a resume with training/components/resume.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from training.build import build
from training.components.async_checkpoint import CheckpointWriter
from training.components.attempts import Restarts
from training.components.checkpoint import (
    CHECKPOINT_SCORE,
    export_hugging_face,
    load_checkpoint,
    load_weights,
    read_train_state,
    save_checkpoint,
)
from training.components.deadline import Deadline
from training.components.drain import DrainWatch, notice_line
from training.components.evaluate import best_evaluation, eval_batches, evaluate, evaluations_since_best
from training.components.optim import learning_rate, set_learning_rate
from training.components.resume import (
    check_resume,
    check_same_architecture,
    checkpoint_settings,
    recorded_global_batch,
)
from training.components.watchdog import COMMIT, EVALUATION, LAST_CHECKPOINT, HangWatchdog
from training.config.run_config import TrainConfig
from training.data.batches import epoch_batches, position_after, synthetic_batches
from training.data.packing import PackedCorpus, PackingStats
from training.data.tokenizer import load_tokenizer
from training.errors import DivergedError, UsageError
from training.metrics.cloudwatch_sink import publish_restart, publish_step
from training.metrics.efa_meter import EfaMeter
from training.metrics.flops import num_params
from training.metrics.report import RunSummary, format_progress_line, format_step_line
from training.metrics.run_metrics import RunMetrics, loss_and_grad_norm
from training.metrics.tensorboard_sink import TensorBoardSink
from training.model.causal_lm import CAUSAL_LM_PREFIX, CausalLMWithFusedLoss, ModelBatch, model_batch
from training.model.loss import global_normalizer
from training.session import Session, emit

HISTORY_KEYS = ("step", "loss", "lr", "grad_norm", "eval_loss", "tokens_per_s", "step_time_s")


def _checkpoint_due(config: TrainConfig, step: int, last: bool) -> bool:
    """A checkpoint every --checkpoint-every steps and at the run's last step (--steps, or where
    it stops early); at the last for --export-hf too."""
    due = config.checkpoint_every and (step % config.checkpoint_every == 0 or last)
    return bool(due or (config.export_hf and last))


def _eval_due(config: TrainConfig, step: int, checkpoint_due: bool) -> bool:
    """Every --eval-every steps, after the last, and at every checkpoint, whose eval_loss ranks it
    among the checkpoints kept (`training.components.checkpoint.checkpoints_kept`)."""
    every = config.eval_every
    return config.eval_data is not None and (
        step == config.steps or checkpoint_due or bool(every and step % every == 0)
    )


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


def _batches(
    config: TrainConfig,
    session: Session,
    vocab_size: int,
    start_step: int,
    rows: np.ndarray | None,
    position: Any,
) -> Iterator[np.ndarray]:
    if rows is None:
        return synthetic_batches(
            seed=config.seed,
            rank=session.rank,
            start_step=start_step,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            vocab_size=vocab_size,
            grad_accum_steps=config.grad_accum_steps,
        )
    return epoch_batches(
        rows,
        seed=config.seed,
        rank=session.rank,
        world_size=session.world_size,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        start=position,
    )


def divergence(step: int, *, loss: float, grad_norm: float, lr: float) -> str | None:
    """Why the run must stop at `step` (its loss or gradient norm is not finite), or None."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            return (
                f"step {step}: the {name} is {value}; stopped before this step's optimizer step and "
                f"checkpoint. Lower --lr (this step's: {lr:g}), or check the data and for bf16 overflow"
            )
    return None


def train_step(
    model: CausalLMWithFusedLoss,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[ModelBatch],
    lr: float,
    max_grad_norm: float,
    defer_grad_sync: bool = False,
    *,
    step: int,
    deadline: Deadline | None = None,
    tally: list[float] | None = None,
) -> tuple[float, float]:
    """Optimizer step `step` on micro-batches (`model_batch` of stored rows; forward and
    backward each in turn, then one clip and one optimizer step); returns the step's loss,
    the sum of the micro-batch losses averaged over the ranks, and the gradient norm before
    clipping. A non-finite loss or gradient
    norm raises `DivergedError` on every rank before the optimizer step touches the weights.
    With `deadline`, this rank's vote to stop after this step rides on the same all-reduce, and
    `deadline.agreed` says whether any rank voted so. `tally`: counts summed over the ranks on the
    same all-reduce, in place (the checkpoint writer's, `CheckpointWriter.ballot`)."""
    set_learning_rate(optimizer, lr)
    # One normaliser for the whole step: each micro-batch's summed loss over the step's
    # valid-label count, so the accumulated gradient is that of the step's token mean.
    normalizer = global_normalizer(*(batch.labels for batch in micro_batches))
    losses = []
    for index, batch in enumerate(micro_batches):
        # By default FSDP2 reduce-scatters after every micro-batch's backward and sums into the
        # sharded fp32 .grad. With defer_grad_sync the micro-batches before the last keep their
        # gradients unsharded (fp32, the whole model's size on every rank) and the layers stay
        # gathered from one backward into the next forward: one reduce-scatter per step.
        last = index == len(micro_batches) - 1
        if defer_grad_sync:
            sharded = cast(FSDPModule, model)  # what `parallelize`'s fully_shard made of it
            sharded.set_requires_gradient_sync(last)
            sharded.set_reshard_after_backward(last)
        loss = model(batch.input_ids, batch.labels, normalizer, batch.position_ids, batch.document_ids)
        loss.backward()
        losses.append(loss.detach())
    # The total norm of FSDP2's sharded gradients is a replicated DTensor: one global value.
    # Without clipping it is computed for the check alone (a pass over the gradients and an
    # all-reduce of one number, queued on the device: no host sync).
    if max_grad_norm:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # The step's one sync: the host reads the loss and the gradient norm here, before the optimizer
    # step, so a non-finite step stops before it reaches the weights. The host waits for the
    # backward, then queues the optimizer step and builds the next batch while the device runs it.
    # Both values are all-reduced, so every rank decides alike and none is left waiting in a
    # collective.
    step_loss, norm, stop = loss_and_grad_norm(
        torch.stack(losses).sum(),
        cast(DTensor, grad_norm).full_tensor(),
        stop=deadline is not None and deadline.vote(),
        tally=tally,
    )
    if deadline is not None:
        deadline.agreed = stop
    problem = divergence(step, loss=step_loss, grad_norm=norm, lr=lr)
    if problem:
        raise DivergedError(problem)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, norm


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


def _stops_early(config: TrainConfig, history: list[dict[str, Any]]) -> bool:
    """--early-stop-patience N: the last N evaluations found no eval_loss below the best before."""
    patience = config.early_stop_patience
    return bool(patience) and evaluations_since_best(history) >= patience


def train(config: TrainConfig, session: Session) -> RunSummary:
    """Build, resume if a checkpoint exists (or take --init-from's weights), train up to
    config.steps (or until the held-out loss stops improving), hand the summary to the session."""
    _prepare_device(session.device)
    restarts = Restarts.begin(session.faults(), config, session.nodes())
    restarts.wait(session.preemption_notice, emit if session.rank == 0 else _silent, time.sleep, time.time)
    start_step, history, resharded = 0, [], False
    position: tuple[int, int] = (0, 0)
    with session.latest_checkpoint() as checkpoint_path:
        model, optimizer, architecture, replicas = build(
            config, session, resuming=checkpoint_path is not None
        )
        corpus = _corpus(config, session)
        rows = None if corpus is None else corpus.rows
        settings = checkpoint_settings(
            config, session.world_size, "synthetic" if corpus is None else corpus.fingerprint
        )
        if checkpoint_path is not None:
            state = read_train_state(checkpoint_path)
            check_resume(state, settings, config.steps, checkpoint_path)
            load_checkpoint(checkpoint_path, model, optimizer)
            start_step, history = state["step"], state["history"]
            saved_world = state.get("world_size", session.world_size)
            resharded = saved_world != session.world_size
            if rows is not None:
                # Checkpoints older than the saved position consumed step x global batch rows.
                saved_position = state.get("data_position")
                position = (
                    (saved_position[0], saved_position[1])
                    if saved_position is not None
                    else position_after(
                        (0, 0),
                        start_step,
                        rows=len(rows),
                        global_batch=recorded_global_batch(state) or settings["global_batch"],
                    )
                )
            if session.rank == 0:
                moved = f", resharded from {saved_world} workers to {session.world_size}" if resharded else ""
                emit(f"resumed from step {start_step} ({checkpoint_path}){moved}")
    if checkpoint_path is None and config.init_from is not None:
        with session.open_checkpoint(config.init_from) as weights_path:
            check_same_architecture(read_train_state(weights_path), architecture, config.init_from)
            load_weights(weights_path, model)
        if session.rank == 0:
            emit(f"initialised from the weights of {config.init_from}; optimizer and step counter fresh")

    def train_state(step: int, eval_loss: float | None) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": step,
            "history": list(history),
            **settings,
            CHECKPOINT_SCORE: eval_loss,
        }
        if rows is not None:
            state["data_position"] = position_after(
                position, step - start_step, rows=len(rows), global_batch=settings["global_batch"]
            )
        state["architecture"] = json.loads(architecture.to_json_string(use_diff=False))
        state["tokenizer"] = config.tokenizer
        return state

    def saver(step: int, eval_loss: float | None, last: bool) -> Callable[[str], None]:
        def write(path: str) -> None:
            save_checkpoint(path, model, optimizer, train_state(step, eval_loss), session.rank)
            if config.export_hf and last:
                tokenizer = load_tokenizer(config.tokenizer)
                export_hugging_face(
                    path, model, architecture, CAUSAL_LM_PREFIX, config.export_dtype, tokenizer, session.rank
                )

        return write

    batches = _batches(config, session, architecture.vocab_size, start_step, rows, position)
    held_out, eval_packing = _eval_set(config, session) if config.eval_data is not None else ([], None)
    packing = _packing(config, session.rank, {"data": corpus and corpus.packing, "eval_data": eval_packing})
    metrics = RunMetrics(config, architecture, session.device, session.world_size, start_step)
    # A resumed run drops the events past its checkpoint that the run before wrote, so its curves
    # do not double back.
    purge_step = start_step + 1 if start_step else None
    sink = TensorBoardSink(config, purge_step) if config.tensorboard and session.rank == 0 else None
    meter = EfaMeter.start(session.device)  # None on every rank without EFA ports
    deadline = (
        None
        if config.deadline is None
        else Deadline(
            config.deadline,
            num_params(architecture),
            evaluates=config.eval_data is not None,
            export_dtype=config.export_dtype if config.export_hf else None,
        )
    )
    if deadline is not None:
        deadline.check_start(session.device)
    stopped_early = stopped_at_deadline = False
    step = start_step
    checkpoint_s: float | None = None
    drain = DrainWatch(session.preemption_notice)
    watchdog = HangWatchdog.start(
        session.rank, session.world_size, config.hang_margin_s, emit, session.note_hang
    )
    checkpoints = CheckpointWriter(
        session,
        model,
        optimizer,
        config.checkpoint_interval_s,
        session.device,
        log=emit if session.rank == 0 else None,
        committed_step=start_step,
    )
    draining = False  # a drain notice was acted on in this attempt
    try:
        for step in range(start_step + 1, config.steps + 1):
            step_start = time.perf_counter()
            if deadline is not None:
                deadline.start_step()
            micro_batches = [
                model_batch(next(batches), session.device) for _ in range(config.grad_accum_steps)
            ]
            lr = learning_rate(config, step)
            ballot = checkpoints.ballot()
            tally = ballot + drain.ballot()  # the drain's votes ride on the same all-reduce
            with watchdog.step(step):
                loss, grad_norm = train_step(
                    model,
                    optimizer,
                    micro_batches,
                    lr,
                    config.max_grad_norm,
                    config.defer_grad_sync,
                    step=step,
                    deadline=deadline,
                    tally=tally,
                )
            checkpoints.count(tally)
            drain.tally(tally[len(ballot) :])
            step_time = time.perf_counter() - step_start
            loss_tokens = sum(batch.loss_tokens for batch in micro_batches)
            attended_pairs = sum(batch.attended_pairs for batch in micro_batches)
            # Every rank's vote was summed in the step's all-reduce: all stop after this step.
            stopped_at_deadline = deadline is not None and deadline.agreed and step < config.steps
            drained = drain.decide()  # the same on every rank: a notice to act on at this step
            in_flight_step = checkpoints.pending.step if checkpoints.pending is not None else None
            # What can commit before the notice's deadline, agreed by every rank (collective).
            choice = (
                checkpoints.drain(drain.notice.deadline, time.time()) if drained and drain.notice else None
            )
            draining = draining or drained  # no periodic write starts after a drain: it would be cut
            # Due whatever the step counts say: the deadline's stop, the drain's own write, the interval.
            forced = (
                stopped_at_deadline
                or (choice is not None and choice.write)
                or (checkpoints.interval_due and not draining)
            )
            due = _checkpoint_due(config, step, last=step == config.steps) or forced
            eval_start = time.perf_counter()
            eval_loss = None
            if _eval_due(config, step, due):
                with watchdog.watch(EVALUATION, step):
                    eval_loss = evaluate(model, held_out, session.device)
            eval_s = None if eval_loss is None else time.perf_counter() - eval_start
            record = metrics.step(
                step,
                loss,
                step_time,
                loss_tokens,
                attended_pairs,
                lr=lr,
                grad_norm=grad_norm,
                eval_loss=eval_loss,
                efa=meter.sample() if meter is not None else None,
            )
            history.append({key: getattr(record, key) for key in HISTORY_KEYS})
            # The eval loss is all-reduced: every rank decides alike.
            stopped_early = eval_loss is not None and step < config.steps and _stops_early(config, history)
            last = step == config.steps or stopped_early or stopped_at_deadline
            checkpoint_due = (_checkpoint_due(config, step, last) and (last or not draining)) or forced
            if session.rank == 0:
                left = None if deadline is None else deadline.left_s()
                emit(format_progress_line(record, deadline_left_s=left))
                emit(format_step_line(record))
                if step == start_step + 1 and (attempt := restarts.first_step(start_step, time.time(), emit)):
                    publish_restart(config, attempt["lost_steps"])  # before the last step's closes the sink
                publish_step(config, record)  # CloudWatch, off the training thread
                if stopped_early:
                    emit(early_stop_line(step, history, config.early_stop_patience))
                if stopped_at_deadline and deadline is not None:
                    emit(deadline_line(step, config.steps, deadline))
                if choice is not None and drain.notice is not None:
                    line = notice_line(
                        drain.notice,
                        step,
                        time.time(),
                        choice,
                        in_flight_step=in_flight_step,
                        write_s=checkpoints.next_write_s(),
                        committed_step=checkpoints.committed_step,
                    )
                    emit(line)
            if sink is not None:
                sink.write(record)
                if checkpoint_due:
                    sink.sync()
            # The checkpoint's time is its write to the run's storage; one
            # before the last is written behind the next steps, and this is its stall.
            report_start = time.perf_counter()
            # A commit may wait for the write in flight, or write the last checkpoint: a write's time is allowed.
            write_s = checkpoints.next_write_s() if checkpoint_due or choice is not None else 0.0
            with watchdog.watch(LAST_CHECKPOINT if last else COMMIT, step, allowance_s=write_s):
                checkpoints.report(
                    record.as_dict(),
                    step,
                    state=train_state(step, eval_loss) if checkpoint_due and not last else None,
                    last=last,
                    save=saver(step, eval_loss, last) if checkpoint_due and last else None,
                    commit_in_flight=choice is not None and choice.commit_in_flight,
                )
            if checkpoint_due:
                checkpoint_s = time.perf_counter() - report_start
            if deadline is not None:
                deadline.record(
                    iteration_s=time.perf_counter() - step_start,
                    eval_s=eval_s,
                    # A write behind the steps is no measure of the synchronous one the deadline's is.
                    checkpoint_s=checkpoint_s if checkpoint_due and last else None,
                )
            if stopped_early or stopped_at_deadline:
                break
    except DivergedError:
        with watchdog.watch(COMMIT, step, allowance_s=checkpoints.next_write_s()):
            checkpoints.commit_in_flight()  # the last good step's checkpoint, when one is being written
        raise
    finally:
        watchdog.stop()
        checkpoints.close()
        # Also when a step diverges: its events up to there are what explains it.
        if sink is not None:
            sink.close()

    best = best_evaluation(history)
    summary = dataclasses.replace(
        metrics.summary(replicas, resharded=resharded),
        stopped_early=stopped_early,
        best_eval_step=None if best is None else best[0],
        best_eval_loss=None if best is None else best[1],
        packing=packing,
        checkpoint_s=checkpoint_s,
        deadline=config.deadline,
        stopped_at_deadline=stopped_at_deadline,
        last_step=step,
        steps_left=config.steps - step,
        **restarts.summary_fields(),
    )
    session.finish(summary.as_dict(), history)
    return summary
