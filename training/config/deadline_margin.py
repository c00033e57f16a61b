"""What a run under --deadline keeps back before its deadline, and what a checkpoint costs before
one is measured: plain arithmetic without torch, so the job (`training.components.deadline`) and
the preview's fit of the run into a reservation's window (`infra`) reckon with the same figures.
"""

from __future__ import annotations

# Before the first checkpoint is measured, its time is estimated from the model's size: fp32
# weights and AdamW's two fp32 moments, 12 bytes a parameter (18.5 GB for Qwen2.5-1.5B), written
# at 100 MB/s, a rate below what a node's disk and S3 upload sustain: an estimate, meant to be slow.
CHECKPOINT_BYTES_PER_PARAMETER = 12
ESTIMATED_WRITE_BYTES_PER_S = 100e6
# After the last step's checkpoint the run still winds down: the launcher takes the last report,
# stops the worker group and writes the summary (4 s from the decision to the process's end on
# `--local` with the tiny model, checkpoint and export included); 30 s keeps room for a cluster's.
WIND_DOWN_S = 30.0
# Bytes a parameter of the Hugging Face export takes in each --export-dtype.
EXPORT_BYTES_PER_PARAMETER = {"bf16": 2, "fp16": 2, "fp32": 4}


def estimated_checkpoint_s(parameters: int) -> float:
    return parameters * CHECKPOINT_BYTES_PER_PARAMETER / ESTIMATED_WRITE_BYTES_PER_S


def estimated_export_s(parameters: int, export_dtype: str) -> float:
    """The export is written at the last step alone, so it is never measured before it."""
    return parameters * EXPORT_BYTES_PER_PARAMETER[export_dtype] / ESTIMATED_WRITE_BYTES_PER_S


def margin_s(*, checkpoint_s: float, slowest_step_s: float, eval_s: float, export_s: float = 0.0) -> float:
    """The time before the deadline in which no further step starts: the rest of the step now
    running and one more (each as long as the slowest so far), its evaluation, its checkpoint
    and Hugging Face export, and the run's wind-down."""
    return checkpoint_s + 2 * slowest_step_s + eval_s + export_s + WIND_DOWN_S
