"""How `training.build.build` shards and loads the model, on 2 gloo ranks of the tiny model.

The model is built on the meta device. A random init is rank 0's full model, broadcast into
every rank's shards; a pretrained one is read by each rank, shard by shard, from the
checkpoint's safetensors files, with no full model anywhere. Either way the result must be the
model of the previous path, where every rank built the full model (`from_pretrained`, for a
pretrained one) and `fully_shard` kept its part. And a step's collectives are counted: the root
unit (the tied embedding / lm_head) must stay gathered from forward into backward, or it is
all-gathered a second time per micro-batch.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from tests.harness.build_session import BuildSession
from tests.harness.paths import REPO_ROOT
from training.build import build
from training.components.optim import build_optimizer
from training.config.run_config import load_model_config, parse_args
from training.distributed.parallelize import build_mesh, parallelize
from training.distributed.rank_exit import end_rank_process, tear_down_process_group
from training.errors import UsageError
from training.model.causal_lm import (
    CausalLMWithFusedLoss,
    ModelBatch,
    build_causal_lm,
    checkpoint_files,
    load_architecture,
    model_batch,
)
from training.step import train_step

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


def _previous_path(
    config, rank: int, replicas: int = 1
) -> tuple[CausalLMWithFusedLoss, torch.optim.Optimizer]:
    """Every rank builds the full model, then shards it: what `build` did before."""
    architecture = load_architecture(config)
    model = CausalLMWithFusedLoss(
        build_causal_lm(config, architecture, torch.device("cpu")), config.loss_chunk_tokens
    )
    parallelize(
        model,
        build_mesh("cpu", WORLD_SIZE, replicas),
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


# The per-shard load's cases: (checkpoint folder, HSDP replicas). Two ranks make a 1-D mesh,
# whose uneven Shard(0) splits the 257-row embedding 129 / 128, or a 2x1 (replicate, shard) one.
PER_SHARD_CASES = {"sharded-checkpoint-1d": ("sharded", 1), "single-file-hsdp-2x1": ("single", 2)}


def _never(*args, **kwargs):
    raise AssertionError("the per-shard load built the full model")


def _per_shard_worker(rank: int, init_file: str, out: str, folders: dict[str, str]) -> None:
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    session = BuildSession(rank, WORLD_SIZE, WORLD_SIZE, torch.device("cpu"))
    result: dict = {}
    for case, (folder, replicas) in PER_SHARD_CASES.items():
        config = parse_args(
            [
                "--preset",
                "tiny",
                "--init",
                "pretrained",
                "--model-id",
                folders[folder],
                "--hsdp-replicas",
                str(replicas),
            ]
        )
        from_pretrained = AutoModelForCausalLM.from_pretrained
        AutoModelForCausalLM.from_pretrained = _never  # type: ignore[method-assign]
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model, optimizer, _, built_replicas = build(config, session)
        finally:
            AutoModelForCausalLM.from_pretrained = from_pretrained  # type: ignore[method-assign]
        collectives = [event.name for event in prof.events() if event.name.startswith("c10d::")]
        causal_lm = model.causal_lm
        previous, previous_optimizer = _previous_path(config, rank, replicas)
        result[case] = {
            "replicas": built_replicas,
            "placements": [type(p).__name__ for p in causal_lm.model.embed_tokens.weight.placements],
            "local_rows": causal_lm.model.embed_tokens.weight.to_local().shape[0],
            "collectives": collectives,
            "tied": causal_lm.lm_head.weight is causal_lm.model.embed_tokens.weight,
            "loaded": _full_parameters(model),
            "previous": _full_parameters(previous),
            "buffers": {name: buffer.clone() for name, buffer in model.named_buffers()},
            "previous_buffers": dict(previous.named_buffers()),
            "loss": _first_step(model, optimizer, config, rank),
            "previous_loss": _first_step(previous, previous_optimizer, config, rank),
        }
    all_results: list = [None] * WORLD_SIZE
    dist.all_gather_object(all_results, result)
    tear_down_process_group()
    if rank == 0:
        torch.save(all_results, out)
    end_rank_process(0)


def _save_bf16(folder: Path, **kwargs) -> str:
    """The tiny model's random weights as the Hub ships Qwen2.5 (bf16 safetensors, tied lm_head
    left out), written by transformers' `save_pretrained`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(777)
    architecture = AutoConfig.for_model(**load_model_config("tiny"))
    AutoModelForCausalLM.from_config(architecture, dtype=torch.bfloat16).save_pretrained(folder, **kwargs)
    return str(folder)


@pytest.fixture(scope="module")
def per_shard(tmp_path_factory) -> list[dict]:
    """Each case on 2 ranks, in one spawn: rank 0's and rank 1's results."""
    tmp = tmp_path_factory.mktemp("per-shard")
    folders = {
        "single": _save_bf16(tmp / "single"),
        # save_pretrained splits at this size into several files and a model.safetensors.index.json.
        "sharded": _save_bf16(tmp / "sharded", max_shard_size="100KB"),
    }
    assert len([name for name in os.listdir(folders["sharded"]) if name.endswith(".safetensors")]) > 2
    out = str(tmp / "result.pt")
    mp.spawn(_per_shard_worker, args=(str(tmp / "pg"), out, folders), nprocs=WORLD_SIZE)
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("case", PER_SHARD_CASES)
def test_each_rank_reads_its_shards_of_the_checkpoint_as_from_pretrained_loads_it(per_shard, case):
    """bf16 safetensors read row by row into fp32 shards give the parameters of `from_pretrained`
    sharded bit for bit, the buffers it computes, the tie kept and the same first-step loss; and
    no rank builds the full model or sends a tensor while loading."""
    for rank, results in enumerate(per_shard):
        result = results[case]
        assert result["tied"]
        assert result["collectives"] == [], (rank, result["collectives"])
        assert result["loaded"].keys() == result["previous"].keys()
        for name, want in result["previous"].items():
            assert want.dtype == torch.float32
            assert torch.equal(result["loaded"][name], want), (rank, name)
        assert result["buffers"].keys() == result["previous_buffers"].keys() != set()
        for name, want in result["previous_buffers"].items():
            assert torch.equal(result["buffers"][name], want), (rank, name)
        assert result["loss"] == result["previous_loss"]


@pytest.mark.slow
def test_the_per_shard_cases_are_an_uneven_fsdp_split_and_an_hsdp_mesh(per_shard):
    """What the cases above cover: 129 / 128 embedding rows on the 1-D mesh, the whole 257 on each
    rank of the (replicate, shard) mesh."""
    assert [r["sharded-checkpoint-1d"]["local_rows"] for r in per_shard] == [129, 128]
    assert per_shard[0]["single-file-hsdp-2x1"]["replicas"] == 2
    assert per_shard[0]["single-file-hsdp-2x1"]["placements"] == ["Replicate", "Shard"]
    assert [r["single-file-hsdp-2x1"]["local_rows"] for r in per_shard] == [257, 257]


def _tampered(folder: Path, change) -> str:
    """A bf16 `save_pretrained` folder whose model.safetensors `change` edits (a dict of tensors)."""
    from safetensors.torch import load_file, save_file

    _save_bf16(folder)
    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return str(folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda w: w.pop("model.norm.weight"), "no file of the checkpoint holds model.norm.weight"),
        (lambda w: w.update(extra=torch.zeros(2)), "holds extra, but the model has none"),
        (
            lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"] * 2}),
            "holds an lm_head.weight unlike the embedding, but its config.json ties them",
        ),
        (
            lambda w: w.update({"model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}),
            "holds model.norm.weight as [64], the model needs [128]",
        ),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_model_is_one_line_naming_the_tensor(
    one_rank_group, tmp_path, change, message
):
    folder = _tampered(tmp_path / "model", change)
    config = parse_args(["--preset", "tiny", "--init", "pretrained", "--model-id", folder])
    with pytest.raises(UsageError) as raised:
        build(config, BuildSession(0, 1, 1, torch.device("cpu")))
    line = str(raised.value)
    assert message in line and f"--model-id {folder}" in line and "\n" not in line


def test_what_from_pretrained_accepts_loads_as_it_does(one_rank_group, tmp_path):
    """A checkpoint that also stores its rotary frequencies and a tied lm_head equal to the
    embedding (as older exports do) loads as the clean one: from_pretrained (transformers 5)
    computes the frequencies from the config and ties an equal stored lm_head."""

    def store_more(weights):
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
        weights["model.rotary_emb.inv_freq"] = torch.ones(4)

    clean = _tampered(tmp_path / "clean", lambda w: None)
    fuller = _tampered(tmp_path / "fuller", store_more)
    built = {}
    for name, folder in (("clean", clean), ("fuller", fuller)):
        config = parse_args(["--preset", "tiny", "--init", "pretrained", "--model-id", folder])
        model = build(config, BuildSession(0, 1, 1, torch.device("cpu")))[0]
        built[name] = {key: value.full_tensor() for key, value in model.state_dict().items()}
    assert built["clean"].keys() == built["fuller"].keys()
    for key, value in built["clean"].items():
        assert torch.equal(value, built["fuller"][key]), key


def test_a_folder_without_safetensors_is_one_line(one_rank_group, tmp_path):
    folder = _tampered(tmp_path / "model", lambda w: None)
    os.remove(os.path.join(folder, "model.safetensors"))
    config = parse_args(["--preset", "tiny", "--init", "pretrained", "--model-id", folder])
    with pytest.raises(UsageError) as raised:
        build(config, BuildSession(0, 1, 1, torch.device("cpu")))
    assert f"--model-id {folder} has neither model.safetensors nor model.safetensors.index.json" in str(
        raised.value
    )


@pytest.mark.slow
def test_a_hub_id_resolves_to_its_snapshot_in_the_hub_cache_without_network(tmp_path):
    """huggingface_hub's documented cache layout (hub/models--ORG--NAME/refs/main naming the
    snapshot, snapshots/REVISION/FILES) and offline mode (HF_HUB_OFFLINE=1): the files are those
    `from_pretrained` loads, in the same cache; a sharded checkpoint's shards included. A model
    the cache lacks is one line with the fix."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--example--tiny"
    _save_bf16(repo / "snapshots" / revision, max_shard_size="100KB")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    script = (
        "import json, sys\n"
        "from training.model.causal_lm import checkpoint_files\n"
        "from transformers import AutoModelForCausalLM\n"
        "AutoModelForCausalLM.from_pretrained('example/tiny')\n"
        "print(json.dumps(checkpoint_files('example/tiny')))\n"
        "try:\n"
        "    checkpoint_files('example/absent')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip().splitlines()
    files = json.loads(printed[-2])
    snapshot = repo / "snapshots" / revision
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    assert files == {key: str(snapshot / name) for key, name in index.items()}
    assert printed[-1].startswith(
        "--model-id example/absent: neither model.safetensors nor model.safetensors.index.json is in the Hub cache"
    )
    assert "--init random" in printed[-1]


def test_a_local_single_file_is_every_tensor_of_it(tmp_path):
    folder = _save_bf16(tmp_path / "model")
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    assert "lm_head.weight" not in keys
    assert checkpoint_files(folder) == dict.fromkeys(keys, os.path.join(folder, "model.safetensors"))


def test_a_resuming_build_reads_no_pretrained_weights(one_rank_group, tmp_path, monkeypatch):
    """A checkpoint's weights replace the built ones: `--init pretrained` reads the folder's
    config but not its weights (on the cluster, a download of the whole model)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import training.build

    folder = str(tmp_path / "pretrained")
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**load_model_config("tiny"))).save_pretrained(
        folder
    )
    config = parse_args(["--preset", "tiny", "--init", "pretrained", "--model-id", folder])
    read = []
    original = training.build.load_shards_from_checkpoint
    monkeypatch.setattr(
        training.build, "load_shards_from_checkpoint", lambda *args: read.append(1) or original(*args)
    )
    session = BuildSession(0, 1, 1, torch.device("cpu"))
    build(config, session, resuming=True)
    assert read == []
    build(config, session)
    assert read == [1]
