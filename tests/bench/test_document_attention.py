"""The document-attention benchmark's rows: the same random tokens, packed causally or as
`documents` isolated documents whose starts the stored rows mark."""

from __future__ import annotations

import numpy as np

from bench.document_attention import rows
from training.data.packing import DOCUMENT_START


def test_isolated_rows_mark_a_document_start_every_seq_len_over_documents_tokens():
    causal = rows(2, 64, 4, vocab_size=1000, isolated=False)
    isolated = rows(2, 64, 4, vocab_size=1000, isolated=True)
    assert causal.shape == isolated.shape == (2, 65)
    assert not (causal & DOCUMENT_START).any()
    starts = [np.flatnonzero(row & DOCUMENT_START).tolist() for row in isolated]
    assert starts == [[16, 32, 48], [16, 32, 48]]  # the first document starts the row unmarked
    assert np.array_equal(isolated & ~DOCUMENT_START, causal)  # the same tokens
    assert np.array_equal(rows(2, 64, 4, 1000, False), causal)  # and the same every run
