"""The TensorBoard sink alone: a run on a URI gets its event files copied to the run folder there,
and a resumed sink purges the earlier run's events after its checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.harness.tensorboard_events import read_scalars
from training.config.run_config import parse_args
from training.metrics.tensorboard_sink import TENSORBOARD_DIR


def test_event_files_of_a_run_on_a_uri_are_copied_to_the_run_folder_there(tmp_path):
    from training.metrics.report import StepMetrics
    from training.metrics.tensorboard_sink import TensorBoardSink

    config = parse_args(["--storage-path", f"file://{tmp_path}/bucket", "--run-name", "remote"])
    sink = TensorBoardSink(config)
    record = StepMetrics(
        step=1, steps=1, loss=2.5, lr=1e-3, grad_norm=0.5, eval_loss=2.75, eval_perplexity=math.exp(2.75),
        step_time_s=0.1, tokens_per_s=100.0, tokens_per_s_per_gpu=50.0, mfu=None, peak_mem_gib=1.0,
    )  # fmt: skip
    sink.write(record)
    sink.close()
    scalars = read_scalars(tmp_path / "bucket" / "remote" / TENSORBOARD_DIR)
    assert scalars["loss/eval"] == {1: 2.75} and scalars["optim/lr"] == pytest.approx({1: 1e-3})
    assert "throughput/mfu" not in scalars
    assert not Path(sink.folder).exists()


def test_a_resumed_sink_purges_the_steps_after_its_checkpoint(tmp_path):
    from tensorboardX.proto.event_pb2 import SessionLog

    from tests.harness.tensorboard_events import read_events
    from training.config.run_config import parse_flags as flags
    from training.metrics.report import StepMetrics
    from training.metrics.tensorboard_sink import TensorBoardSink

    config = flags(["--storage-path", str(tmp_path), "--run-name", "run"])
    folder = tmp_path / "run" / "tensorboard"
    values = {
        "loss": 1.0,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "eval_loss": None,
        "eval_perplexity": None,
        "step_time_s": 1.0,
    }
    rest = {"tokens_per_s": 1.0, "tokens_per_s_per_gpu": 1.0, "mfu": None, "peak_mem_gib": 0.0}
    first = TensorBoardSink(config)
    for step in range(1, 7):
        first.write(StepMetrics(step=step, steps=10, **values, **rest))
    first.close()
    resumed = TensorBoardSink(config, purge_step=5)
    resumed.write(StepMetrics(step=5, steps=10, **values, **rest))
    resumed.close()
    starts = [event.step for event in read_events(folder) if event.session_log.status == SessionLog.START]
    assert starts == [5]  # TensorBoard drops the earlier run's events from step 5 on
