"""The flex checks' isolation check, run on the CPU with the tiny architecture in float32 (the
benchmark runs it on a GPU): a document of a packed row, under the job's block mask, gives the
logits and the loss it gives alone, while plain causal attention over the row does not."""

from __future__ import annotations

import pytest
import torch

from bench.flex_checks import DOCUMENT_LENGTHS, isolation


@pytest.mark.slow  # about 30 s on 2 cores: the tiny model's isolation check end to end
def test_a_document_in_a_packed_row_under_the_block_mask_is_as_if_alone_and_causal_is_not():
    result = isolation("tiny", torch.float32, torch.device("cpu"))
    assert (result["model_config"], result["dtype"], result["document_lengths"]) == (
        "tiny",
        "float32",
        list(DOCUMENT_LENGTHS),
    )
    assert result["isolated_flex_vs_alone"]["relative_norm_difference"] < 1e-5
    assert result["causal_packed_vs_alone"]["relative_norm_difference"] > 0.1  # the check can fail
    assert result["loss_in_the_row"] == pytest.approx(result["loss_alone"], rel=1e-5)
