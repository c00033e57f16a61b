"""How `training.loop.build` shards and loads the model, on 2 gloo ranks of the tiny model.

The model is built on the meta device and only rank 0 holds the full weights, which it
broadcasts into every rank's shards: the result must be the model of the previous path, where
every rank built the full model and `fully_shard` kept its part. And a step's collectives are
counted: the root unit (the tied embedding / lm_head) must stay gathered from forward into
backward, or it is all-gathered a second time per micro-batch.
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from tests.build_session import BuildSession
from training.config import load_model_config, parse_args
from training.loop import build, train_step
from training.model import CausalLMWithFusedLoss, ModelBatch, build_causal_lm, load_architecture, model_batch
from training.optim import build_optimizer
from training.parallelize import build_mesh, parallelize
from training.rank_exit import end_rank_process, tear_down_process_group

WORLD_SIZE = 2
SEQ_LEN = 32
# The c10d ops FSDP2's collectives dispatch to (torch 2.13, gloo), as the profiler names them.
ALL_GATHER_OP = "c10d::_allgather_base_"
REDUCE_SCATTER_OP = "c10d::_reduce_scatter_base_"


def _rows(rank: int) -> ModelBatch:
    generator = torch.Generator().manual_seed(3 + rank)
    rows = torch.randint(0, 256, (2, SEQ_LEN + 1), generator=generator)
    return model_batch(rows.numpy(), torch.device("cpu"))


def _full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().full_tensor() for name, param in model.named_parameters()}


def _previous_path(config, rank: int) -> tuple[CausalLMWithFusedLoss, torch.optim.Optimizer]:
    """Every rank builds the full model, then shards it: what `build` did before."""
    architecture = load_architecture(config)
    model = CausalLMWithFusedLoss(
        build_causal_lm(config, architecture, torch.device("cpu")), config.loss_chunk_tokens
    )
    parallelize(
        model,
        build_mesh("cpu", WORLD_SIZE, 1),
        compile_layers=config.compile,
        activation_checkpointing=config.activation_checkpointing,
        reshard_after_forward=config.reshard_after_forward,
    )
    return model, build_optimizer(model, config, torch.device("cpu"))


def _first_step(model, optimizer, config, rank: int) -> float:
    loss, _ = train_step(model, optimizer, [_rows(rank)], config.lr, config.max_grad_norm, step=1)
    return loss


def _worker(rank: int, init_file: str, out: str, pretrained_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    session = BuildSession(rank, WORLD_SIZE, WORLD_SIZE, torch.device("cpu"))
    result: dict = {}
    for init, flags in (
        ("random", ["--preset", "tiny"]),
        ("pretrained", ["--preset", "tiny", "--init", "pretrained", "--model-id", pretrained_dir]),
    ):
        config = parse_args(flags)
        model, optimizer, _, _ = build(config, session)
        causal_lm = model.causal_lm
        tied = causal_lm.lm_head.weight is causal_lm.model.embed_tokens.weight
        loaded = _full_parameters(model)
        buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss = _first_step(model, optimizer, config, rank)
        ops = collections.Counter(event.name for event in prof.events() if event.name.startswith("c10d::"))
        previous, previous_optimizer = _previous_path(config, rank)
        result[init] = {
            "tied": tied,
            "loaded": loaded,
            "previous": _full_parameters(previous),
            "buffers": buffers,
            "previous_buffers": dict(previous.named_buffers()),
            "loss": loss,
            "previous_loss": _first_step(previous, previous_optimizer, config, rank),
            "ops": dict(ops),
            "layers": len(model.decoder_layers),
        }
    tear_down_process_group()
    if rank == 0:
        torch.save(result, out)
    end_rank_process(0)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """Both inits on 2 ranks, in one spawn; the pretrained folder holds other weights than the
    seeded random init, written by transformers' `save_pretrained`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("sharded-build")
    torch.manual_seed(12345)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**load_model_config("tiny"))).save_pretrained(
        tmp / "pretrained"
    )
    out = str(tmp / "result.pt")
    mp.spawn(_worker, args=(str(tmp / "pg"), out, str(tmp / "pretrained")), nprocs=WORLD_SIZE)
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("init", ["random", "pretrained"])
def test_meta_build_loads_the_weights_the_previous_path_built(two_ranks, init):
    """Same parameters bit for bit, same rotary buffers, the tie kept, the same first-step loss."""
    result = two_ranks[init]
    assert result["tied"]
    assert result["loaded"].keys() == result["previous"].keys()
    for name, want in result["previous"].items():
        assert torch.equal(result["loaded"][name], want), name
    assert result["buffers"].keys() == result["previous_buffers"].keys()
    for name, want in result["previous_buffers"].items():
        assert torch.equal(result["buffers"][name], want), name
    assert result["loss"] == result["previous_loss"]


@pytest.mark.slow
def test_the_pretrained_weights_are_not_the_random_init(two_ranks):
    """The pretrained load reads the folder's weights rather than keeping a seeded init."""
    name = "causal_lm.model.embed_tokens.weight"
    assert not torch.equal(two_ranks["pretrained"]["loaded"][name], two_ranks["random"]["loaded"][name])


@pytest.mark.slow
def test_a_step_all_gathers_each_layer_twice_and_the_root_once(two_ranks):
    """Forward gathers the root and each layer; backward re-gathers every layer but the last
    (kept gathered) and not the root (FSDP2's default for the root). A root resharded after
    forward adds one all-gather of the embedding per micro-batch. Each unit's gradients are
    reduce-scattered once."""
    result = two_ranks["random"]
    layers = result["layers"]
    assert result["ops"].get(ALL_GATHER_OP) == 2 * layers
    assert result["ops"].get(REDUCE_SCATTER_OP) == layers + 1
