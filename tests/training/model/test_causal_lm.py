"""The causal LM's fused loss (training/model/causal_lm.py, `CausalLMWithFusedLoss`) is the mean
over the global batch's valid labels, on any number of ranks and micro-batches.

Two gloo ranks on CPU whose batches hold very different numbers of valid labels must
produce the loss and the gradients of one process training on both batches at once.
FSDP2 averages gradients over the ranks (torch.distributed.fsdp: the reduce-scatter
divides by the data-parallel size), which is what the normaliser must compensate.
Likewise a step accumulated over micro-batches of uneven valid-label counts must give
the loss, gradients and updated weights of one step over all its rows as one batch.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy

import training.distributed.parallelize
from tests.harness.accumulated_step import (
    ONE_RANK_MICRO_BATCHES,
    TWO_RANK_MICRO_BATCHES,
    accumulated_step,
    assert_same_step,
    token_rows,
    two_rows,
)
from tests.harness.build_session import BuildSession
from training.build import build
from training.config.run_config import parse_args
from training.distributed.parallelize import build_mesh, parallelize
from training.distributed.rank_exit import end_rank_process, tear_down_process_group
from training.errors import DivergedError
from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture, model_batch
from training.model.loss import IGNORE_INDEX
from training.step import train_step


def _train_step(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    # fp32 throughout, so the comparison is exact to rounding and tests the normalisation alone.
    training.distributed.parallelize.MIXED_PRECISION = MixedPrecisionPolicy()
    config = parse_args(["--preset", "tiny"])
    architecture = load_architecture(config)
    model = CausalLMWithFusedLoss(build_causal_lm(config, architecture, torch.device("cpu")), 8)
    parallelize(
        model,
        build_mesh("cpu", world_size, 1),
        compile_layers=False,
        activation_checkpointing=False,
        reshard_after_forward=True,
    )
    inputs, labels = two_rows()
    if world_size > 1:
        inputs, labels = inputs[rank : rank + 1], labels[rank : rank + 1]
    loss = model(inputs, labels)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
    _end_rank(rank, {"loss": total.item() / world_size, "grads": grads}, out)


def _gloo_threads() -> list[str]:
    """Names of this process's gloo threads (Linux: /proc/self/task/*/comm)."""
    names = (Path(task, "comm").read_text().strip() for task in Path("/proc/self/task").iterdir())
    return sorted(name for name in names if "gloo" in name)


def _end_rank(rank: int, result: dict, out: str) -> None:
    """As a torchrun rank ends (`training.distributed.rank_exit`). Rank 0 saves the result with the gloo
    threads still alive after the groups are destroyed: why ranks end without finalization."""
    tear_down_process_group()
    if rank == 0:
        gc.collect()
        torch.save({**result, "gloo_threads_after_teardown": _gloo_threads()}, out)
    end_rank_process(0)


def _run(world_size: int, tmp_path) -> dict:
    out = str(tmp_path / f"world{world_size}.pt")
    mp.spawn(_train_step, args=(world_size, str(tmp_path / f"pg{world_size}"), out), nprocs=world_size)
    return torch.load(out)


@pytest.mark.slow
def test_two_ranks_with_uneven_valid_labels_match_one_process(tmp_path):
    single, split = _run(1, tmp_path), _run(2, tmp_path)
    assert split["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert single["grads"].keys() == split["grads"].keys()
    for name, want in single["grads"].items():
        torch.testing.assert_close(split["grads"][name], want, rtol=1e-4, atol=1e-7, msg=name)


# --- gradient accumulation ------------------------------------------------------------------------


def _accumulation_worker(
    rank: int, world_size: int, init_file: str, out: str, split: bool, defer_grad_sync: bool
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    training.distributed.parallelize.MIXED_PRECISION = MixedPrecisionPolicy()
    micro_batches = TWO_RANK_MICRO_BATCHES[rank] if split else [slice(0, len(token_rows()))]
    result = accumulated_step(rank, world_size, micro_batches, defer_grad_sync)
    _end_rank(rank, result, out)


def _run_accumulation(world_size: int, split: bool, tmp_path, defer_grad_sync: bool = False) -> dict:
    name = f"accum-world{world_size}-{'split' if split else 'whole'}-{defer_grad_sync}"
    out = str(tmp_path / f"{name}.pt")
    init_file = str(tmp_path / f"pg-{name}")
    mp.spawn(
        _accumulation_worker,
        args=(world_size, init_file, out, split, defer_grad_sync),
        nprocs=world_size,
    )
    return torch.load(out)


@pytest.fixture(scope="module")
def one_process_step_on_all_rows(tmp_path_factory) -> dict:
    """The reference of the 2-rank accumulation tests, spawned once for both of them."""
    return _run_accumulation(1, False, tmp_path_factory.mktemp("one-process"))


@pytest.mark.slow
@pytest.mark.parametrize("defer_grad_sync", [False, True], ids=["sync-per-micro-batch", "deferred-sync"])
def test_two_ranks_of_two_uneven_micro_batches_match_one_process_with_one_batch(
    tmp_path, defer_grad_sync, one_process_step_on_all_rows
):
    """2 gloo ranks x 2 micro-batches (1 + 3 and 3 + 1 rows) against 1 process stepping on all
    8 rows at once: the normaliser spans both the micro-batches and the ranks, whether the
    gradients are reduced after each micro-batch or once per step."""
    assert_same_step(_run_accumulation(2, True, tmp_path, defer_grad_sync), one_process_step_on_all_rows)


@pytest.mark.slow
def test_gloo_threads_outlive_destroy_process_group(one_process_step_on_all_rows):
    """Why ranks end through `training.distributed.rank_exit`: after an FSDP2 step, a barrier,
    `destroy_process_group()` and a garbage collection, gloo's worker threads still run (DTensor's
    caches keep the mesh and its groups alive). When a torch release joins them, this fails and
    the ranks may end through the interpreter again."""
    assert "pt_gloo_runloop" in one_process_step_on_all_rows["gloo_threads_after_teardown"]


def test_deferred_sync_under_bf16_mixed_precision_matches_the_per_micro_batch_reduce():
    """With the loop's real policy (bf16 compute, fp32 reduce), FSDP2 keeps the deferred
    micro-batches' gradients in fp32 too, so both ways sum the same fp32 gradients."""
    results = []
    for defer_grad_sync in (False, True):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            results.append(accumulated_step(0, 1, ONE_RANK_MICRO_BATCHES[0], defer_grad_sync))
        finally:
            dist.destroy_process_group()
    assert_same_step(results[1], results[0])


# --- a non-finite step ---------------------------------------------------------------------------


def _nan_loss_on_rank_1_worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    """One train_step of the tiny model whose loss is NaN on rank 1 alone: the error each rank
    raised and whether its weights are those from before the step."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    config = parse_args(["--preset", "tiny"])
    model, optimizer, _, _ = build(config, BuildSession(rank, world_size, world_size, torch.device("cpu")))
    if rank == 1:
        model.register_forward_hook(lambda module, args, loss: loss * math.nan)
    before = {name: param.detach().full_tensor() for name, param in model.named_parameters()}
    rows = token_rows()[rank * 4 : rank * 4 + 4]
    with pytest.raises(DivergedError) as raised:
        batch = model_batch(rows.numpy(), torch.device("cpu"))
        train_step(model, optimizer, [batch], config.lr, config.max_grad_norm, step=1)
    after = {name: param.detach().full_tensor() for name, param in model.named_parameters()}
    unchanged = all(torch.equal(before[name], after[name]) for name in before)
    torch.save({"message": str(raised.value), "unchanged": unchanged}, f"{out}.{rank}")
    tear_down_process_group()
    end_rank_process(0)


@pytest.mark.slow
def test_a_loss_that_is_nan_on_one_rank_stops_every_rank_before_the_optimizer_step(tmp_path):
    """Rank 0's own loss is finite: it stops on the all-reduced loss, as rank 1 does, and neither
    is left waiting in a collective."""
    out = str(tmp_path / "nan")
    mp.spawn(_nan_loss_on_rank_1_worker, args=(2, str(tmp_path / "pg-nan"), out), nprocs=2)
    for rank in (0, 1):
        result = torch.load(f"{out}.{rank}")
        assert result["message"].startswith("step 1: the loss is nan;"), rank
        assert result["unchanged"], rank


# --- held-out evaluation --------------------------------------------------------------------------


def _evaluate_then_train(rank: int, world_size: int, init_file: str, out: str, policy: str) -> None:
    """Evaluate this rank's rows of `token_rows`, then train one step on the same rows: the
    evaluation sees the weights the step's loss is computed with. Under the job's bf16 policy too:
    had FSDP2 cast the normaliser the loop passes to the model to bf16 (its default for floating
    forward inputs), the training loss would carry a bf16-rounded 1/count (6e-5 relative here)
    that evaluation does not."""
    from training.components.evaluate import evaluate

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    if policy == "fp32":
        training.distributed.parallelize.MIXED_PRECISION = MixedPrecisionPolicy()
    config = parse_args(["--preset", "tiny"])
    model, optimizer, _, _ = build(config, BuildSession(rank, world_size, world_size, torch.device("cpu")))
    rows = token_rows()[TWO_RANK_MICRO_BATCHES[rank][0] if world_size > 1 else slice(None)]
    held_out = evaluate(model, [rows.numpy()], torch.device("cpu"))
    batch = model_batch(rows.numpy(), torch.device("cpu"))
    trained, _ = train_step(model, optimizer, [batch], config.lr, config.max_grad_norm, step=1)
    _end_rank(rank, {"eval": held_out, "train": trained}, out)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_eval_loss_of_a_batch_is_its_training_loss_before_the_step(world_size, policy, tmp_path):
    """On 2 ranks the rows are uneven (1 row with 31 valid labels against 3 rows with 96): the
    evaluation must weigh every label alike across the ranks, as the training loss does."""
    out = str(tmp_path / "eval.pt")
    mp.spawn(_evaluate_then_train, args=(world_size, str(tmp_path / "pg"), out, policy), nprocs=world_size)
    result = torch.load(out)
    assert result["eval"] == pytest.approx(result["train"], rel=1e-6)
    assert 5 < result["eval"] < 6  # random bytes: about log(256) = 5.55


def test_a_batch_counts_the_query_key_pairs_its_documents_attend():
    """A row of documents of 3 and 5 tokens attends 3·4/2 + 5·6/2 pairs, a row of one document
    8·9/2: `attended_pairs`, which `mfu_done` counts attention by, is flops.attended_share's count."""
    from training.data.packing import DOCUMENT_START
    from training.metrics.flops import attended_share

    stored = torch.arange(2 * 9, dtype=torch.int32).reshape(2, 9).numpy()
    stored[:, 0] |= DOCUMENT_START
    stored[0, 3] |= DOCUMENT_START  # row 0: tokens 0-2, then 3-7 (the 9th is the last label only)
    batch = model_batch(stored, torch.device("cpu"))
    assert batch.attended_pairs == 6 + 15 + 36 == round(attended_share([[3, 5], [8]], 8) * 2 * 8 * 8)
    causal = model_batch(stored[1:], torch.device("cpu"))
    assert causal.position_ids is None and causal.attended_pairs == 36


# --- a term added to the loss ---------------------------------------------------------------------


def _hidden_norm_term(hidden: torch.Tensor, labels: torch.Tensor, normalizer: torch.Tensor) -> torch.Tensor:
    """A term on the hidden states: their squared norm at each valid label, over the normaliser."""
    valid = (labels != IGNORE_INDEX).to(hidden.dtype)
    return 1e-2 * (hidden.pow(2).sum(dim=-1) * valid).sum() / normalizer


def test_a_hidden_state_term_gets_the_gradient_of_the_unfused_loss_by_autograd():
    """`loss_terms`: a term on the final hidden states, added with plain autograd, gives the loss and
    every weight's gradient of the unfused reference (full logits, cross-entropy, the term); with
    no term the loss is the fused cross-entropy alone."""
    config = parse_args(["--preset", "tiny"])
    model = CausalLMWithFusedLoss(build_causal_lm(config, load_architecture(config), torch.device("cpu")), 8)
    inputs, labels = two_rows()
    plain = model(inputs, labels).detach()
    model.loss_terms.append(_hidden_norm_term)

    fused = model(inputs, labels)
    fused.backward()
    got = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    flat_labels = labels.flatten()
    normalizer = (flat_labels != IGNORE_INDEX).sum().float()
    hidden = model.causal_lm.model(input_ids=inputs, use_cache=False).last_hidden_state.flatten(0, 1)
    logits = hidden @ model.causal_lm.lm_head.weight.t()
    cross_entropy = torch.nn.functional.cross_entropy(logits, flat_labels, ignore_index=IGNORE_INDEX)
    reference = cross_entropy + _hidden_norm_term(hidden, flat_labels, normalizer)
    reference.backward()

    torch.testing.assert_close(plain, cross_entropy.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
    assert reference.item() - cross_entropy.item() > 1e-3  # the term counts
    for name, param in model.named_parameters():
        torch.testing.assert_close(got[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
