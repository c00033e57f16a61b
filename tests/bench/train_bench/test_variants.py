"""The benchmark's variants: the rows of isolated documents and the attention shares their MFU counts."""

from __future__ import annotations

from bench.train_bench.variants import attention_shares, documents_rows
from training.model.causal_lm import model_batch


def test_the_isolated_variants_rows_hold_the_documents_their_mfu_counts():
    """The benchmark's rows of 8 documents a row are what the loop isolates (model_batch), and their
    attention shares are those of 8 causal documents of 512 tokens: 80 of the 1,024 flex blocks."""
    import torch

    rows = documents_rows(3, 4096, 8, vocab_size=1000)
    batch = model_batch(rows, torch.device("cpu"))
    assert batch.document_ids is not None
    assert batch.document_ids[:, -1].tolist() == [7, 7, 7]
    assert (batch.position_ids == 0).sum(dim=1).tolist() == [8, 8, 8]
    shares = attention_shares({"seq_len": 4096, "documents": 8, "attention": "flex"})
    assert shares == {"attended": 8 * 512 * 513 / 2 / 4096**2, "blocks": 80 / 1024}
    assert attention_shares({"seq_len": 4096}) == {"attended": 4097 / 2 / 4096}
