"""The run's corpus on Ray: read and tokenized by Ray Data in parallel, packed on the driver.

The documents are packed in corpus order (so rows do not depend on blocks or CPU count) as they
stream in, into the corpus cache (training/data/corpus_cache.py) unless a run with the same inputs
put it there already; `ray_launcher` hands each worker the cached rows.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Generator
from typing import cast

import numpy as np
import ray.data

from training.config.run_config import TrainConfig
from training.data.batches import steps_per_epoch
from training.data.corpus_cache import CachedCorpus, cached_rows, corpus_sources
from training.data.documents import batch_tokens, parse_files_batch, tokenize_batch
from training.data.packing import RowPacker
from training.errors import UsageError


def tokenized_documents(paths: list[str], config: TrainConfig) -> ray.data.Dataset:
    """Corpus files (local://, URIs, or local paths under --local) as a Ray Dataset of one token
    array per document, in corpus order."""
    _configure_ray_data()
    files = ray.data.read_binary_files(paths, include_paths=True)
    return files.map_batches(
        functools.partial(parse_files_batch, text_column=config.text_column), batch_format="numpy"
    ).map_batches(
        functools.partial(tokenize_batch, tokenizer=config.tokenizer, attention=config.packing_attention),
        batch_format="numpy",
    )


def pack_dataset(documents: ray.data.Dataset, packer: RowPacker) -> None:
    """Feed a dataset of token arrays, in its order, to a packer: one streaming pass on the driver,
    so rows cross block boundaries and only the last partial row is dropped. Ray Data's batch
    generator is closed here, even when a batch holds a bad corpus file: its clean-up calls Ray,
    and the error's traceback would keep it alive until after `ray.shutdown`."""
    batches = cast(Generator[dict[str, np.ndarray]], iter(documents.iter_batches(batch_format="numpy")))
    with contextlib.closing(batches):
        for batch in batches:
            for tokens in batch_tokens(batch):
                packer.add(tokens)


def _configure_ray_data() -> None:
    """Set on the driver before any dataset is built."""
    context = ray.data.DataContext.get_current()
    # Documents reach the packer in corpus order, so the rows are the same on every
    # run and every cluster, and a resumed run replays exactly the data it missed.
    context.execution_options.preserve_order = True


def cached_corpus(config: TrainConfig, workers: int, flag: str = "--data") -> CachedCorpus:
    """The run's corpus (`flag`: --data or --eval-data) in the corpus cache, packed there now if no
    run with the same inputs did; a usage error if the rows of --data cannot fill one step (those of
    --eval-data need not: the evaluation fills its last batch, and a set of no rows is the loop's
    error)."""
    data = config.data if flag == "--data" else config.eval_data
    assert data is not None
    # On a cluster only the driver's node holds local files: Ray Data reads them there.
    sources = corpus_sources(data, flag, on_driver_node=config.local)
    entry, reused = cached_rows(
        config,
        sources,
        lambda packer: pack_dataset(tokenized_documents([source.path for source in sources], config), packer),
    )
    done = "read from the corpus cache" if reused else "tokenized into the corpus cache"
    print(
        f"{flag} {data}: {entry.rows} rows of {entry.seq_len + 1} tokens {done} {entry.location}", flush=True
    )
    if flag != "--data":
        return entry
    try:
        steps_per_epoch(
            entry.rows,
            world_size=workers,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            grad_accum_steps=config.grad_accum_steps,
        )
    except ValueError as error:
        raise UsageError(f"{flag} {data}: {error}") from error
    return entry
