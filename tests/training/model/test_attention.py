"""The attention kernel a run trains with (`--attention auto`: flex on GPUs, SDPA otherwise and as
the fallback), and the FlexAttention block mask of isolated documents (training/model/attention.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from training.config.run_config import parse_flags
from training.data.packing import DOCUMENT_START
from training.errors import UsageError
from training.model import attention
from training.model.attention import SMALL_TILES, attention_kernel, document_block_mask, document_mask_mod
from training.model.causal_lm import load_architecture, model_batch

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)  # only named: the compile check is replaced below
GPU_RUN = ["--preset", "throughput", "--data", "training/corpus", "--init", "random"]
# What Triton reports when a kernel's tiles need more shared memory than the GPU has (the L4's
# 99 KiB a block), as torch's issue 133254 quotes it.
OUT_OF_SHARED_MEMORY = (
    "OutOfResources: out of resource: shared memory, Required: 131074, Hardware limit: 101376"
)


@pytest.fixture
def compile_results(monkeypatch):
    """Replace the device compile check: each call pops the next result (None: it compiled)."""
    results: list[str | None] = []
    calls: list[dict | None] = []

    def compile_error(architecture, device, tiles):
        calls.append(tiles)
        return results.pop(0)

    monkeypatch.setattr(attention, "flex_compile_error", compile_error)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    return results, calls


def kernel_of(argv, device, warnings):
    config = parse_flags(argv)
    return attention_kernel(config, load_architecture(config), device, warnings.append)


def test_auto_trains_with_flex_where_it_compiles(compile_results):
    results, calls = compile_results
    results.append(None)
    warnings: list[str] = []
    assert kernel_of(GPU_RUN, GPU, warnings) == ("flex", None)
    assert calls == [None] and warnings == []  # torch's own tiles first


def test_smaller_tiles_are_tried_when_torchs_own_do_not_fit(compile_results):
    results, calls = compile_results
    results.extend([OUT_OF_SHARED_MEMORY, None])
    warnings: list[str] = []
    assert kernel_of(GPU_RUN, GPU, warnings) == ("flex", SMALL_TILES)
    assert calls == [None, SMALL_TILES] and warnings == []


def test_auto_falls_back_to_sdpa_with_one_warning_line_when_flex_does_not_compile(compile_results):
    results, _ = compile_results
    results.extend([OUT_OF_SHARED_MEMORY, OUT_OF_SHARED_MEMORY])
    warnings: list[str] = []
    assert kernel_of(GPU_RUN, GPU, warnings) == ("sdpa", None)
    assert warnings == [
        f"warning: --attention auto: FlexAttention does not compile on NVIDIA L4 ({OUT_OF_SHARED_MEMORY}); "
        "training with sdpa, which computes the blocks isolated documents mask out"
    ]


def test_flex_asked_for_and_not_compiling_stops_at_start_in_one_line(compile_results):
    results, _ = compile_results
    results.extend([OUT_OF_SHARED_MEMORY, OUT_OF_SHARED_MEMORY])
    with pytest.raises(UsageError) as raised:
        kernel_of([*GPU_RUN, "--attention", "flex"], GPU, [])
    assert str(raised.value) == (
        f"--attention flex: FlexAttention does not compile on NVIDIA L4 ({OUT_OF_SHARED_MEMORY}); "
        "use --attention sdpa"
    )


@pytest.mark.parametrize(
    ("argv", "device"),
    [
        ([*GPU_RUN, "--attention", "sdpa"], GPU),
        ([*GPU_RUN, "--document-attention", "packed"], GPU),
        (["--preset", "tiny"], CPU),
        (GPU_RUN, CPU),  # --gpu on a process without one: nothing to compile flex on
    ],
)
def test_sdpa_runs_compile_nothing(compile_results, argv, device):
    _, calls = compile_results
    assert kernel_of(argv, device, []) == ("sdpa", None)
    assert calls == []


def test_flex_forward_is_kept_off_the_gpu_when_asked_for(compile_results):
    """The tests' flex forward on the CPU: --gpu --attention flex builds flex, with no compile check."""
    _, calls = compile_results
    assert kernel_of(["--preset", "tiny", "--gpu", "--attention", "flex"], CPU, []) == ("flex", None)
    assert calls == []


def test_the_document_mask_is_causal_inside_each_document_and_blind_across():
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    dense = create_mask(document_mask_mod(document_ids), 2, 1, 6, 6, device="cpu")[:, 0]
    q, kv = torch.arange(6)[:, None], torch.arange(6)[None, :]
    for row in range(2):
        ids = document_ids[row]
        assert torch.equal(dense[row], (kv <= q) & (ids[:, None] == ids[None, :]))
    assert torch.equal(dense[1], torch.ones(6, 6, dtype=torch.bool).tril())  # one document: causal


def test_the_block_mask_skips_the_blocks_between_documents():
    """Two 256-token documents a row of 512 in 128-token blocks: each document's 3 blocks on and
    below its diagonal are computed, 6 of the 16, none across the boundary."""
    document_ids = (torch.arange(512) >= 256).int().expand(2, 512)
    mask = document_block_mask(document_ids)
    assert mask.BLOCK_SIZE == (attention.FLEX_BLOCK, attention.FLEX_BLOCK)
    computed = mask.kv_num_blocks + mask.full_kv_num_blocks
    assert computed[0, 0].tolist() == [1, 2, 1, 2]
    dense = mask.to_dense()[0, 0]
    assert dense[2:, :2].sum() == 0 and dense[:2, 2:].sum() == 0


def test_document_ids_count_the_document_starts_the_positions_restart_at():
    rows = np.arange(2 * 13, dtype=np.int32).reshape(2, 13)
    rows[0, [0, 4, 9]] |= DOCUMENT_START
    rows[1, 7] |= DOCUMENT_START
    batch = model_batch(rows, CPU)
    assert batch.document_ids is not None and batch.position_ids is not None
    assert batch.document_ids.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2], [0] * 7 + [1] * 5]
    restarts = (batch.position_ids[:, 1:] == 0).int()
    assert torch.equal(batch.document_ids[:, 1:] - batch.document_ids[:, :-1], restarts)
    assert model_batch(rows & ~DOCUMENT_START, CPU).document_ids is None


# FlexAttention compiles its kernel on first use (about 13 s on the CPU), so these run with the slow tests.
@pytest.mark.slow
def test_the_compile_check_reports_a_failure_in_one_line_instead_of_raising():
    """On the CPU flex's backward does not run: the check returns the error's first line."""
    config = parse_flags(["--preset", "tiny"])
    error = attention.flex_compile_error(load_architecture(config), CPU, None)
    assert error is not None and "\n" not in error and error.split(":")[0].isidentifier()


@pytest.mark.slow
def test_flex_with_the_job_mask_gives_sdpas_loss_on_causal_and_isolated_rows():
    """The same weights (seed) and rows through the job's model with SDPA and with flex (forward,
    float32 on the CPU): rows without a document start, where flex takes the job's mask of one
    document a row, and rows of isolated documents."""
    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm

    config = parse_flags(["--preset", "tiny", "--gpu", "--attention", "flex"])
    architecture = load_architecture(config)
    models = {
        kernel: CausalLMWithFusedLoss(
            build_causal_lm(dataclasses.replace(config, attention=kernel), architecture, CPU), 64
        ).eval()
        for kernel in ("sdpa", "flex")
    }
    rows = np.random.default_rng(0).integers(0, 256, size=(2, 301), dtype=np.int32)
    isolated = rows.copy()
    isolated[:, [0, 90, 200]] |= DOCUMENT_START
    for stored in (rows, isolated):
        batch = model_batch(stored, CPU)
        with torch.no_grad():
            losses = {
                kernel: model(batch.input_ids, batch.labels, None, batch.position_ids, batch.document_ids)
                for kernel, model in models.items()
            }
        torch.testing.assert_close(losses["flex"], losses["sdpa"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_tiles_the_check_picked_reach_every_layers_flex_call(monkeypatch):
    """The model hands `flex_tiles` to transformers' flex call of each decoder layer (forward on the
    CPU, which takes the options; the GPU compiles them into the kernels)."""
    import transformers.integrations.flex_attention as flex_integration

    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm

    config = parse_flags(["--preset", "tiny", "--gpu", "--attention", "flex"])
    architecture = load_architecture(config)
    model = CausalLMWithFusedLoss(build_causal_lm(config, architecture, CPU), 64, SMALL_TILES).eval()
    seen = []
    original = flex_integration.compile_friendly_flex_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("kernel_options"))
        return original(*args, **kwargs)

    monkeypatch.setattr(flex_integration, "compile_friendly_flex_attention", spy)
    batch = model_batch(np.random.default_rng(0).integers(0, 256, size=(2, 129), dtype=np.int32), CPU)
    with torch.no_grad():
        assert torch.isfinite(
            model(batch.input_ids, batch.labels, None, batch.position_ids, batch.document_ids)
        )
    assert seen == [SMALL_TILES] * architecture.num_hidden_layers
