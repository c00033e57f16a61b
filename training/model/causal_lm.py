"""The model: a Hugging Face causal LM whose forward returns the fused, globally normalised loss.

Every rank builds it on the meta device and shards it before any weight exists; then each rank
reads its own shards of a pretrained checkpoint (`load_shards_from_checkpoint`), or receives them
from rank 0's seeded random model (`shard_weights_from_rank0`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, NamedTuple, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.config.model_configs import load_model_config
from training.config.run_config import TrainConfig
from training.config.settings import ATTENTION_KERNELS
from training.data.packing import DOCUMENT_START, NO_LOSS, TOKEN_ID
from training.errors import MODEL_SOURCE_FIX, UsageError, first_line
from training.model.attention import document_block_mask
from training.model.loss import (
    IGNORE_INDEX,
    ChunkFn,
    LossTerm,
    chunk_loss_and_logit_grad,
    fused_linear_cross_entropy,
    global_normalizer,
)

# Transformers imports torchao whenever it is installed (for its quantizers), and torchao then
# warns that its C++ extensions do not load on a CPU build of torch or one it was not built
# against. The float8 training linears (--float8) are plain PyTorch and need none of them.
logging.getLogger("torchao").setLevel(logging.ERROR)


def _not_torchao_enum_registration(record: logging.LogRecord) -> bool:
    """Drop the warning torch (2.13) logs each time torchao, at import, registers one of its Enums
    as a pytree constant (torch/utils/_pytree.py: "is an Enum subclass and is now natively
    supported"); torchao's to fix, nothing a user of this job can act on."""
    return "is an Enum subclass and is now natively supported" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_not_torchao_enum_registration)


# The training model's name for the causal LM: its state dict's keys are the checkpoint's under it.
# The output embedding a tied model shares with the input one (Qwen2's `tie_word_embeddings`).
TIED_LM_HEAD = "lm_head.weight"
CAUSAL_LM_PREFIX = "causal_lm."
ARCHITECTURE_FIX = "pass a checkpoint of the architecture the model id's config.json describes"


def load_architecture(config: TrainConfig) -> Any:
    """The transformers config of the model to train (shipped JSON for random init)."""
    from transformers import AutoConfig

    if config.init == "pretrained":
        return AutoConfig.from_pretrained(config.model_id)
    values = load_model_config(config.model_config)
    return AutoConfig.for_model(**values)


def build_causal_lm(config: TrainConfig, architecture: Any, device: torch.device) -> nn.Module:
    """The full fp32 model: random (seeded, built on `device`) or the model id's pretrained
    weights (on the host). The loop builds only the random one, on rank 0 alone, as the source of
    `shard_weights_from_rank0`; the pretrained one is the reference `load_shards_from_checkpoint`
    is measured and tested against."""
    from transformers import AutoModelForCausalLM

    if config.init == "pretrained":
        return AutoModelForCausalLM.from_pretrained(
            config.model_id,
            config=architecture,
            dtype=torch.float32,
            attn_implementation=ATTENTION_KERNELS[config.wanted_attention],
        )
    torch.manual_seed(config.seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            architecture, dtype=torch.float32, attn_implementation=ATTENTION_KERNELS[config.wanted_attention]
        )


class ModelBatch(NamedTuple):
    """One micro-batch as the model takes it."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    # None when no document restarts inside a row: positions run 0..seq_len-1 and attention
    # stays plainly causal.
    position_ids: torch.Tensor | None
    loss_tokens: int  # the labels that count, read on the host
    # The query-key pairs causal attention inside each document leaves (a document of l tokens
    # attends l·(l+1)/2), counted on the host: what `mfu_done` counts attention's FLOPs by.
    attended_pairs: int
    # Each token's document within its row (0, 1, ...), where position_ids is not None: what
    # FlexAttention's block mask is built from (`training.model.attention.document_block_mask`).
    document_ids: torch.Tensor | None = None


def model_batch(rows: np.ndarray, device: torch.device) -> ModelBatch:
    """Stored rows of seq_len + 1 tokens (ids with `training.data.packing`'s flags) as the model's inputs:
    inputs row[:-1], labels row[1:] except NO_LOSS tokens and document starts (whose input
    token belongs to the document before), positions restarting at each DOCUMENT_START.
    Decided here on the host, so the choice of causal or per-document attention costs the
    device no synchronisation."""
    stored = torch.tensor(rows, dtype=torch.int64)  # a copy: Ray Data's arrays are read-only
    ids = stored & TOKEN_ID
    skipped = (stored[:, 1:] & (NO_LOSS | DOCUMENT_START)) != 0
    labels = ids[:, 1:].masked_fill(skipped, IGNORE_INDEX)
    starts = (stored[:, :-1] & DOCUMENT_START) != 0
    position_ids = document_ids = None
    row_count, seq_len = starts.shape
    # A token at position p of its document attends p + 1 keys; one document a row: S·(S+1)/2.
    attended_pairs = row_count * seq_len * (seq_len + 1) // 2
    if starts[:, 1:].any():
        index = torch.arange(seq_len).expand_as(starts)
        last_start = torch.where(starts, index, 0).cummax(dim=1).values
        positions = index - last_start
        attended_pairs = int((positions + 1).sum())
        position_ids = positions.to(device)
        document_ids = starts[:, 1:].cumsum(dim=1, dtype=torch.int32)
        document_ids = torch.cat([torch.zeros_like(document_ids[:, :1]), document_ids], dim=1).to(device)
    return ModelBatch(
        input_ids=ids[:, :-1].to(device),
        labels=labels.to(device),
        position_ids=position_ids,
        loss_tokens=int((labels != IGNORE_INDEX).sum()),
        attended_pairs=attended_pairs,
        document_ids=document_ids,
    )


def build_meta_causal_lm(config: TrainConfig, architecture: Any) -> nn.Module:
    """The model with no storage (the meta device), which every rank shards before any weight
    exists, so that a rank only ever allocates its own shards (`load_shards_from_checkpoint`,
    `shard_weights_from_rank0`)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            architecture, dtype=torch.float32, attn_implementation=ATTENTION_KERNELS[config.wanted_attention]
        )


def shard_weights_from_rank0(
    model: CausalLMWithFusedLoss, source: nn.Module | None, device: torch.device
) -> None:
    """Collective, after `fully_shard` of a `build_meta_causal_lm` model: allocates each rank's
    shards on `device` and fills them from rank 0's full `source` (None on the other ranks), one
    tensor broadcast at a time. The buffers (the rotary frequencies, which no state dict holds)
    are broadcast whole. Only rank 0 holds the full model; another rank holds its shards and, while
    it is broadcast, one full tensor (the embedding, at most), where each rank used to hold all.
    The loop keeps this path for a random init: the seeded init draws one RNG stream over the full
    tensors, which no rank could draw for its shard alone and get the same model whatever the
    world size or mesh."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # Every parameter and buffer gets uninitialised storage; a tied weight stays one parameter
    # (FSDP2 swaps the DTensor's contents in place).
    model.to_empty(device=device)
    full = (
        {}
        if source is None
        else {f"{CAUSAL_LM_PREFIX}{key}": value for key, value in source.state_dict().items()}
    )
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    source_buffers = {} if source is None else dict(source.named_buffers())
    for name, buffer in model.causal_lm.named_buffers():
        if source is not None:
            buffer.copy_(source_buffers[name])
        dist.broadcast(buffer, src=0)


def checkpoint_files(model_id: str) -> dict[str, str]:
    """Each tensor of `model_id`'s safetensors checkpoint and the local file holding it, found as
    `from_pretrained` finds them (transformers' `cached_file`: a folder's own files, or the Hub
    cache's snapshot, downloaded there first if absent): model.safetensors, else the files
    model.safetensors.index.json maps. Ranks of one node may call this at once: huggingface_hub
    downloads each file under a file lock into a temporary file renamed into place."""
    from safetensors import safe_open
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    def resolve(filename: str) -> str | None:
        try:
            # transformers' own from_pretrained passes this flag: None for a file the repo lacks.
            return cached_file(model_id, filename, _raise_exceptions_for_missing_entries=False)
        except OSError as error:
            raise UsageError(
                f"--model-id {model_id}: {first_line(error)} To fix: {MODEL_SOURCE_FIX.format(name=model_id)}"
            ) from None

    single = resolve(SAFE_WEIGHTS_NAME)
    if single is not None:
        with safe_open(single, "pt") as weights:
            return dict.fromkeys(weights.keys(), single)
    index = resolve(SAFE_WEIGHTS_INDEX_NAME)
    if index is None and os.path.isdir(model_id):
        raise UsageError(
            f"--model-id {model_id} has neither {SAFE_WEIGHTS_NAME} nor {SAFE_WEIGHTS_INDEX_NAME}: "
            "pass a model saved as safetensors (save_pretrained's default)"
        )
    if index is None:
        raise UsageError(
            f"--model-id {model_id}: neither {SAFE_WEIGHTS_NAME} nor {SAFE_WEIGHTS_INDEX_NAME} is in the Hub "
            f"cache or could be downloaded. To fix: {MODEL_SOURCE_FIX.format(name=model_id)}"
        )
    with open(index) as handle:
        weight_map: dict[str, str] = json.load(handle)["weight_map"]
    paths = {name: resolve(name) for name in sorted(set(weight_map.values()))}
    for name, path in paths.items():
        if path is None:
            raise UsageError(f"--model-id {model_id}: {index} names {name}, which the model lacks")
    return {key: cast(str, paths[name]) for key, name in weight_map.items()}


# The input embedding, which a tied lm_head is.
EMBEDDING = "model.embed_tokens.weight"


def _local_rows(param: Any) -> tuple[slice, ...]:
    """The part of the full tensor that this rank's shard of the DTensor `param` holds (its own
    placements: FSDP2's uneven Shard(0), HSDP's (Replicate, Shard(0)))."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))


def load_shards_from_checkpoint(model: CausalLMWithFusedLoss, model_id: str, device: torch.device) -> None:
    """After `fully_shard` of a `build_meta_causal_lm` model, on each rank alone (no collective):
    allocates the rank's shards on `device` and reads into them, as fp32, only the rows (the
    DTensor's own placements: FSDP2's uneven Shard(0), HSDP's (Replicate, Shard(0))) of each
    tensor that the rank holds, from the safetensors files `checkpoint_files` finds (mapped, so
    only those rows are read). No rank holds more than its shards and one bf16 slice of one tensor.
    Names are the checkpoint's under `CAUSAL_LM_PREFIX` (transformers 5 renames no Qwen2 key on
    load); the tied lm_head is the embedding (one parameter, which the checkpoint holds once);
    the buffers (the rotary frequencies, which no checkpoint holds) are computed from the config
    on the host, as `from_pretrained` computes them, and copied to `device`. Any tensor missing,
    left over (but a stored buffer, or a stored lm_head equal to the embedding it is tied to, both
    of which from_pretrained accepts) or of another shape is a one-line error naming it and the file."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    files = checkpoint_files(model_id)
    model.to_empty(device=device)
    # named_parameters names a tied weight once, by its first name: the embedding's.
    parameters = {
        name.removeprefix(CAUSAL_LM_PREFIX): cast(DTensor, param) for name, param in model.named_parameters()
    }
    tied = model.causal_lm.lm_head.weight is model.causal_lm.model.embed_tokens.weight
    # As from_pretrained does, stored buffers are ignored (the rotary frequencies are computed from
    # the config) and a stored lm_head is accepted under a tied config when it equals the embedding.
    buffer_keys = {name.removeprefix(CAUSAL_LM_PREFIX) for name, _ in model.named_buffers()}
    stored_head = tied and TIED_LM_HEAD in files
    unexpected = sorted(files.keys() - parameters.keys() - buffer_keys - ({TIED_LM_HEAD} if tied else set()))
    if unexpected:
        key = unexpected[0]
        raise UsageError(
            f"--model-id {model_id}: {files[key]} holds {key}, but the model has none: {ARCHITECTURE_FIX}"
        )
    missing = sorted(parameters.keys() - files.keys())
    if missing:
        raise UsageError(
            f"--model-id {model_id}: no file of the checkpoint holds {missing[0]}: {ARCHITECTURE_FIX}"
        )
    by_file: dict[str, list[str]] = {}
    for key in parameters:
        by_file.setdefault(files[key], []).append(key)
    with torch.no_grad():
        for path, keys in by_file.items():
            with safe_open(path, "pt") as weights:
                for key in keys:
                    param = parameters[key]
                    stored = weights.get_slice(key)
                    if tuple(stored.get_shape()) != tuple(param.shape):
                        raise UsageError(
                            f"--model-id {model_id}: {path} holds {key} as {list(stored.get_shape())}, "
                            f"the model needs {list(param.shape)}: {ARCHITECTURE_FIX}"
                        )
                    param.to_local().copy_(stored[_local_rows(param)])
        if stored_head:
            embedding = parameters[EMBEDDING]
            with safe_open(files[TIED_LM_HEAD], "pt") as weights:
                head = weights.get_slice(TIED_LM_HEAD)[_local_rows(embedding)]
            if not torch.equal(head.to(torch.float32), embedding.to_local().cpu()):
                raise UsageError(
                    f"--model-id {model_id}: {files[TIED_LM_HEAD]} holds an {TIED_LM_HEAD} unlike the "
                    "embedding, but its config.json ties them: set tie_word_embeddings to false there"
                )
        for module in model.causal_lm.modules():
            buffers = dict(module.named_buffers(recurse=False))
            if buffers:
                computed = dict(type(module)(config=module.config).named_buffers())
                for name, buffer in buffers.items():
                    buffer.copy_(computed[name])


class CausalLMWithFusedLoss(nn.Module):
    """A Hugging Face causal LM whose forward returns the loss through the fused lm_head, plus
    each of `loss_terms` (none by default): functions of the final hidden states, the labels and
    the normaliser (`training.model.loss.LossTerm`) whose gradients autograd computes. A term is
    added in training and in evaluation alike (docs/training/changing-the-loss.md)."""

    def __init__(
        self, causal_lm: nn.Module, loss_chunk_tokens: int, flex_tiles: dict[str, Any] | None = None
    ):
        super().__init__()
        self.causal_lm: Any = causal_lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.chunk_fn: ChunkFn = chunk_loss_and_logit_grad
        self.loss_terms: list[LossTerm] = []
        # FlexAttention's kernel tiles (`training.model.attention.attention_kernel`); None: torch's own.
        self.flex_tiles = flex_tiles

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.causal_lm.model.layers

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        normalizer: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The summed loss over `normalizer`: the step's `global_normalizer` over all its
        micro-batches' labels, or, when None, over these labels alone (a step of one batch).
        `position_ids` that restart inside a row confine each document's attention to itself.
        With FlexAttention, `document_ids` (None: one document a row) give the one block mask
        every layer takes; otherwise transformers reads the positions as packed sequences
        (attention mask None, no cache) and builds the block-diagonal causal mask, which reads
        them back to the host once."""
        labels = labels.flatten()
        if normalizer is None:
            normalizer = global_normalizer(labels)
        extra: dict[str, Any] = {}
        if self.causal_lm.config._attn_implementation == ATTENTION_KERNELS["flex"]:
            # Rows without a document start get the same mask (one document each) and positions of
            # the batch's shape, so the compiled layers see one mask function and one rotary shape
            # and never recompile for transformers' causal mask or its [1, seq] positions.
            if document_ids is None:
                document_ids = torch.zeros_like(input_ids, dtype=torch.int32)
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            extra["attention_mask"] = document_block_mask(document_ids)
            if self.flex_tiles:
                extra["kernel_options"] = self.flex_tiles
        hidden = self.causal_lm.model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra
        ).last_hidden_state.flatten(0, 1)
        loss = fused_linear_cross_entropy(
            hidden, self.causal_lm.lm_head.weight, labels, normalizer, self.loss_chunk_tokens, self.chunk_fn
        )
        for term in self.loss_terms:
            loss = loss + term(hidden, labels, normalizer)
        return loss
