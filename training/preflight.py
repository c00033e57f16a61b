"""Checks on the launching process before any worker starts, so that a model or tokenizer
the Hugging Face Hub cannot deliver, or a package a flag needs, is one line instead of a
traceback from every worker."""

from __future__ import annotations

from training.config import TrainConfig
from training.errors import UsageError
from training.presets import BYTE_TOKENIZER
from training.tokenizer import load_tokenizer

FIX = (
    "connect to the Hub, or download it beforehand (`huggingface-cli download {name}`) into the "
    "cache HF_HOME points at, or train from scratch with --init random"
)


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def check_model_files(config: TrainConfig) -> None:
    """Fetch (or find cached) the pretrained model's config and the corpus tokenizer."""
    if config.init == "pretrained":
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(config.model_id)
        except OSError as error:
            raise UsageError(
                f"--model-id {config.model_id}: {first_line(error)} To fix: {FIX.format(name=config.model_id)}"
            ) from error
    if not config.synthetic_data and config.tokenizer != BYTE_TOKENIZER:
        try:
            load_tokenizer(config.tokenizer)
        except OSError as error:
            raise UsageError(
                f"--tokenizer {config.tokenizer}: {first_line(error)} To fix: {FIX.format(name=config.tokenizer)}"
            ) from error


def check_packages(config: TrainConfig) -> None:
    """torchao for --float8, tensorboardX for --tensorboard (Ray Train brings it; a torchrun-only
    environment may not): the workers run the same image as this process."""
    if config.float8:
        try:
            import torchao.float8  # noqa: F401
        except ImportError as error:
            raise UsageError(
                f"--float8 needs torchao ({first_line(error)}): pip install torchao==0.18.0, or pass --no-float8"
            ) from error
    if config.tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError as error:
            raise UsageError(
                f"--tensorboard needs tensorboardX ({first_line(error)}): pip install tensorboardX==2.6.5, "
                "or pass --no-tensorboard"
            ) from error
