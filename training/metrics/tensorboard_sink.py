"""TensorBoard event files of a run, written by rank 0 into `<run folder>/tensorboard/`.

tensorboardX writes them (it comes with ray[train]: no TensorFlow, no torch.utils.tensorboard
and its `tensorboard` package). With an s3:// (or other URI) --storage-path the files are written
to a local folder and copied to the run folder through pyarrow's filesystems, as Ray Train
stores checkpoints: at each checkpoint and when the run ends.
"""

from __future__ import annotations

import shutil
import tempfile

from training.config.run_config import TrainConfig, is_uri
from training.metrics.report import StepMetrics

TENSORBOARD_DIR = "tensorboard"
# TensorBoard tag -> the step metric it plots (StepMetrics field); a step without a value
# (no evaluation, no MFU on CPU) writes no point.
SCALARS = {
    "loss/train": "loss",
    "loss/eval": "eval_loss",
    "perplexity/eval": "eval_perplexity",
    "optim/lr": "lr",
    "optim/grad_norm": "grad_norm",
    "throughput/tokens_per_s": "tokens_per_s",
    "throughput/tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
    "throughput/mfu": "mfu",
    "throughput/step_time_s": "step_time_s",
    "memory/peak_gib": "peak_mem_gib",
}
# One curve per node (its host name) of a per-node step metric; absent without EFA.
PER_NODE_SCALARS = {"network/efa_bytes_per_s": "efa_bytes_per_s"}


def tensorboard_dir(config: TrainConfig) -> str:
    """Where the run's event files end up: local folder or URI."""
    return f"{config.storage_path.rstrip('/')}/{config.run_name}/{TENSORBOARD_DIR}"


class TensorBoardSink:
    """Scalars of every step record; `sync` publishes what was written so far."""

    def __init__(self, config: TrainConfig, purge_step: int | None = None) -> None:
        """`purge_step`: a resumed run's first step; TensorBoard drops the events written from it on
        by the run before (a run stopped after its last checkpoint), so no curve doubles back."""
        from tensorboardX import SummaryWriter

        target = tensorboard_dir(config)
        self.remote = target if is_uri(target) else None
        self.folder = tempfile.mkdtemp(prefix="tensorboard-") if self.remote else target
        self.writer = SummaryWriter(self.folder, purge_step=purge_step)

    def write(self, record: StepMetrics) -> None:
        for tag, key in SCALARS.items():
            value = getattr(record, key)
            if value is not None:
                self.writer.add_scalar(tag, value, record.step)
        for tag, key in PER_NODE_SCALARS.items():
            for node, node_value in (getattr(record, key) or {}).items():
                if node_value is not None:
                    self.writer.add_scalar(f"{tag}/{node}", node_value, record.step)

    def sync(self) -> None:
        self.writer.flush()
        self._upload()

    def close(self) -> None:
        self.writer.close()
        self._upload()
        if self.remote:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _upload(self) -> None:
        if self.remote:
            from pyarrow import fs

            filesystem, path = fs.FileSystem.from_uri(self.remote)
            filesystem.create_dir(path, recursive=True)  # a local filesystem needs the folder
            fs.copy_files(self.folder, path, destination_filesystem=filesystem)
