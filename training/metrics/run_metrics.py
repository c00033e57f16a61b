"""Step and run metrics: time, tokens/s, MFU and peak memory, as report.py's typed records."""

from __future__ import annotations

import math
import resource
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from training.config.run_config import TrainConfig
from training.metrics.efa_meter import EfaSample
from training.metrics.flops import flops_per_token, mfu, num_params, peak_flops
from training.metrics.report import RunSummary, StepMetrics

GIB = 2**30


def perplexity(loss: float) -> float:
    """exp(loss); infinite where it overflows a float (a loss above about 709)."""
    return math.exp(loss) if loss < math.log(float(np.finfo(np.float64).max)) else math.inf


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _across_ranks(value: float, device: torch.device, op: dist.ReduceOp.RedOpType) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.item()


class RunMetrics:
    """Collects each step's time, loss and loss tokens; makes the step records and the run summary."""

    def __init__(
        self, config: TrainConfig, architecture: Any, device: torch.device, world_size: int, start_step: int
    ) -> None:
        self.config, self.architecture, self.device = config, architecture, device
        self.world_size, self.start_step = world_size, start_step
        self.started = time.perf_counter()
        self.gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        self.peak = peak_flops(self.gpu_name)
        self.flops_per_token = flops_per_token(architecture, config.seq_len)
        self.flops_per_token_causal = flops_per_token(architecture, config.seq_len, causal=True)
        self.tokens_per_step = config.batch_size * config.seq_len * world_size * config.grad_accum_steps
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.eval_loss: float | None = None
        self.loss_tokens = 0  # this rank's; the summary adds the ranks' up
        self.attended_pairs = 0  # this rank's, as loss_tokens
        # Rank 0, with EFA: per node, the bytes and seconds of the samples after the first step.
        self.efa_totals: dict[str, tuple[float, float] | None] | None = None

    def step(
        self,
        step: int,
        loss: float,
        step_time: float,
        loss_tokens: int,
        attended_pairs: int,
        *,
        lr: float,
        grad_norm: float,
        eval_loss: float | None,
        efa: EfaSample | None = None,
    ) -> StepMetrics:
        """`step_time` is the training step's alone (an evaluation after it is not counted);
        `loss_tokens`: this rank's labels that counted in the step's loss; `attended_pairs`: the
        query-key pairs its rows' documents attend (`ModelBatch.attended_pairs`); `efa`: what each
        node's EFA ports moved since the step before (rank 0, with EFA)."""
        self.loss_tokens += loss_tokens
        self.attended_pairs += attended_pairs
        if efa is not None and self.step_times:  # the first step's interval is left out, as its time
            self._add_efa(efa)
        self.step_times.append(step_time)
        self.losses.append(loss)
        if eval_loss is not None:
            self.eval_loss = eval_loss
        tokens_per_s = self.tokens_per_step / step_time
        return StepMetrics(
            step=step,
            steps=self.config.steps,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            eval_loss=eval_loss,
            eval_perplexity=None if eval_loss is None else perplexity(eval_loss),
            step_time_s=step_time,
            tokens_per_s=tokens_per_s,
            tokens_per_s_per_gpu=tokens_per_s / self.world_size,
            mfu=mfu(tokens_per_s / self.world_size, self.flops_per_token, self.peak),
            peak_mem_gib=peak_memory_gib(self.device),
            efa_bytes_per_s=None if efa is None else _rates(efa),
        )

    def _add_efa(self, efa: EfaSample) -> None:
        totals = self.efa_totals if self.efa_totals is not None else dict.fromkeys(efa, (0.0, 0.0))
        self.efa_totals = {host: _plus(totals.get(host), sample) for host, sample in efa.items()}

    def _attended_share(self) -> float | None:
        """Collective: the share of the S × S scores the ranks' rows attended over the run (causal
        rows about 0.5; rows of isolated documents less); None before any step."""
        rows = len(self.step_times) * self.config.batch_size * self.config.grad_accum_steps * self.world_size
        pairs = _across_ranks(self.attended_pairs, self.device, dist.ReduceOp.SUM)
        return pairs / (rows * self.config.seq_len**2) if rows else None

    def _efa_summary(self) -> dict[str, Any]:
        """The summary's EFA fields; none without EFA samples after the first step."""
        if self.efa_totals is None:
            return {}
        steps = len(self.step_times) - 1
        per_s = _rates(self.efa_totals)
        known = [rate for rate in per_s.values() if rate is not None]
        line = self.config.line_rate_gbps
        return {
            "efa_bytes_per_s": per_s,
            "efa_bytes_per_step": {
                host: None if total is None else total[0] / steps for host, total in self.efa_totals.items()
            },
            "efa_line_rate_fraction": max(known) * 8 / (2 * line * 1e9) if line and known else None,
        }

    def summary(self, replicas: int, *, resharded: bool) -> RunSummary:
        """Collective (the peak memory is the largest over the ranks)."""
        # Step one pays for compilation and allocator warm-up; it would skew the rate.
        measured = self.step_times[1:] or self.step_times
        step_time = statistics.median(measured) if measured else None
        per_gpu = self.tokens_per_step / step_time / self.world_size if step_time else None
        config = self.config
        attended = self._attended_share()
        return RunSummary(
            world_size=self.world_size,
            steps=config.steps,
            start_step=self.start_step,
            resharded=resharded,
            steps_run=len(self.step_times),
            tokens_per_s=per_gpu * self.world_size if per_gpu else None,
            tokens_per_s_per_gpu=per_gpu,
            steps_per_s=1 / step_time if step_time else None,
            mfu=mfu(per_gpu, self.flops_per_token, self.peak) if per_gpu else None,
            mfu_causal=mfu(per_gpu, self.flops_per_token_causal, self.peak) if per_gpu else None,
            mfu_done=mfu(
                per_gpu, flops_per_token(self.architecture, config.seq_len, attended=attended), self.peak
            )
            if per_gpu and attended is not None
            else None,
            attended_share=attended,
            loss_first=self.losses[0] if self.losses else None,
            loss_last=self.losses[-1] if self.losses else None,
            eval_loss=self.eval_loss,
            eval_perplexity=None if self.eval_loss is None else perplexity(self.eval_loss),
            lr_schedule=config.lr_schedule,
            peak_mem_gib=_across_ranks(peak_memory_gib(self.device), self.device, dist.ReduceOp.MAX),
            step_time_s=step_time,
            duration_s=time.perf_counter() - self.started,
            gpu_name=self.gpu_name,
            device=self.device.type,
            model=config.model_id,
            init=config.init,
            parameters=num_params(self.architecture),
            flops_per_token=self.flops_per_token,
            preset=config.preset,
            data="synthetic" if config.synthetic_data else "corpus",
            seq_len=config.seq_len,
            batch_size=config.batch_size,
            grad_accum_steps=config.grad_accum_steps,
            tokens_per_step=self.tokens_per_step,
            tokens_seen=self.tokens_per_step * len(self.step_times),
            loss_tokens=int(_across_ranks(self.loss_tokens, self.device, dist.ReduceOp.SUM)),
            hsdp_replicas=replicas,
            compile=config.compile,
            activation_checkpointing=config.activation_checkpointing,
            run_name=config.run_name,
            **self._efa_summary(),
        )


def _plus(
    total: tuple[float, float] | None, sample: tuple[float, float] | None
) -> tuple[float, float] | None:
    """Bytes and seconds added up; once a node's count is unknown (a device reset) it stays so."""
    return None if total is None or sample is None else (total[0] + sample[0], total[1] + sample[1])


def _rates(samples: EfaSample) -> dict[str, float | None]:
    """Bytes per second per node; None where unknown or no time passed."""
    return {
        host: None if sample is None or sample[1] <= 0 else sample[0] / sample[1]
        for host, sample in samples.items()
    }
