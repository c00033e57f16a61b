"""`python -m training.export CHECKPOINT_DIR OUT_DIR`: a Hugging Face model from any saved checkpoint.

Runs in one process without a process group: DCP reads every rank's shards of the model (not
the optimizer) into a model built on the CPU from the architecture the checkpoint records.
Exit 2 with one line when the folder is no checkpoint of this job.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from training.components import storage
from training.components.checkpoint import (
    hugging_face_weights,
    is_complete,
    read_train_state,
    write_hugging_face,
)
from training.config.presets import BYTE_TOKENIZER
from training.config.run_config import TRAIN_STATE_FILE
from training.config.settings import EXPORT_DTYPES
from training.data.tokenizer import load_tokenizer
from training.model.causal_lm import CAUSAL_LM_PREFIX as PREFIX
from training.model.causal_lm import load_architecture  # noqa: F401  (its log filters quiet torchao's import)

PROGRAM = "python -m training.export"


def export(checkpoint: str, out: str, dtype: str) -> None:
    """Raises ValueError (one line) when `checkpoint` cannot be exported."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    if not is_complete(checkpoint):
        raise ValueError(f"{checkpoint}: not a checkpoint folder (no {TRAIN_STATE_FILE})")
    state = read_train_state(checkpoint)
    if "architecture" not in state:
        raise ValueError(
            f"{checkpoint}: written before checkpoints recorded their architecture; "
            "export at the end of a run with --export-hf instead"
        )
    architecture = AutoConfig.for_model(**state["architecture"])
    model = AutoModelForCausalLM.from_config(architecture)
    weights = {PREFIX + key: value for key, value in model.state_dict().items()}
    with warnings.catch_warnings():
        # DCP warns that it loads in one process: what this module means to do.
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load({"model": weights}, storage_reader=storage.storage_reader(checkpoint))
    tied = bool(getattr(architecture, "tie_word_embeddings", False))
    tokenizer = load_tokenizer(state.get("tokenizer", BYTE_TOKENIZER))
    weights = hugging_face_weights(weights, PREFIX, tied=tied, dtype=dtype)
    write_hugging_face(out, weights, architecture, dtype, tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument(
        "checkpoint",
        help="a checkpoint of a run (holding train_state.json): a local folder or its URI (s3://...)",
    )
    parser.add_argument("out", help="the folder to write the Hugging Face model into")
    parser.add_argument(
        "--export-dtype", choices=EXPORT_DTYPES, default="bf16", help="dtype of the weights (default: bf16)"
    )
    args = parser.parse_args(argv)
    try:
        export(args.checkpoint, args.out, args.export_dtype)
    except (ValueError, OSError) as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.out).resolve()} ({args.export_dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
