"""Host and device memory of building and sharding the model, per rank, on each path the job
has had, in one run, so that each is measured beside the baseline (every rank builds the full
fp32 model, then shards it):

- every-rank-full: the baseline.
- meta-broadcast: the model built on the meta device and sharded; rank 0 alone builds the full
  fp32 model and broadcasts it into the shards (`training/model/causal_lm.py:shard_weights_from_rank0`). The
  loop's path for --init random.
- per-shard: --init pretrained only. Each rank reads its own shards from the safetensors files
  (`training/model/causal_lm.py:load_shards_from_checkpoint`); no rank builds the full model. The loop's path
  for --init pretrained.

Each path runs in its own torchrun job, so each rank's peak RSS is that path's alone. No corpus
(synthetic data) and no network: --init pretrained reads a local folder.

    python -m bench.load_memory --out bench/reports/load-memory_HW_YYYYMM/load.json --model-config qwen2.5-1.5b --nproc 4
    python -m bench.load_memory --out … --write-pretrained /tmp/qwen --model-config qwen2.5-1.5b
    python -m bench.load_memory --out … --init pretrained --model-id /tmp/qwen --nproc 1

`--write-pretrained DIR` first saves random weights of the architecture as a bf16
`save_pretrained` folder (the Hub's format for Qwen2.5), for `--init pretrained` without network.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

PATHS = {
    "random": ("every-rank-full", "meta-broadcast"),
    "pretrained": ("every-rank-full", "meta-broadcast", "per-shard"),
}
RESULT_PREFIX = "LOAD_MEMORY "
GIB = 1024**3


def _config(args: argparse.Namespace) -> Any:
    from training.config.run_config import parse_args

    flags = ["--model-config", args.model_config, "--init", args.init, "--data", "synthetic", "--no-compile"]
    return parse_args(flags + (["--model-id", args.model_id] if args.model_id else []))


def _every_rank_full(config: Any, device: torch.device, world_size: int) -> torch.nn.Module:
    """The baseline: every rank holds the full fp32 model, then shards it."""
    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture

    model = CausalLMWithFusedLoss(
        build_causal_lm(config, load_architecture(config), device), config.loss_chunk_tokens
    )
    _parallelize(model, config, device, world_size)
    return model


def _meta_broadcast(config: Any, device: torch.device, rank: int, world_size: int) -> torch.nn.Module:
    """Shards on the meta device, filled from rank 0's full fp32 model."""
    from training.model.causal_lm import (
        CausalLMWithFusedLoss,
        build_causal_lm,
        build_meta_causal_lm,
        load_architecture,
        shard_weights_from_rank0,
    )

    architecture = load_architecture(config)
    source = build_causal_lm(config, architecture, device) if rank == 0 else None
    model = CausalLMWithFusedLoss(build_meta_causal_lm(config, architecture), config.loss_chunk_tokens)
    _parallelize(model, config, device, world_size)
    shard_weights_from_rank0(model, source, device)
    return model


def _parallelize(model: Any, config: Any, device: torch.device, world_size: int) -> None:
    from training.distributed.parallelize import build_mesh, parallelize

    parallelize(
        model,
        build_mesh(device.type, world_size, 1),
        compile_layers=False,
        activation_checkpointing=config.activation_checkpointing,
        reshard_after_forward=config.reshard_after_forward,
    )


class _Session:
    """What `training.build.build` reads of a launcher's session: one FSDP group of all ranks."""

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.local_world_size, self.device = rank, world_size, world_size, device


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: build with `args.path` (the loop's own `build` for the init's last path),
    then report this rank's peaks."""
    from training.build import build

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    config = _config(args)
    import transformers.modeling_utils  # noqa: F401  (counted before the build, as on every path)

    # Linux reports ru_maxrss in KiB. Before the build: the interpreter, torch and transformers.
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    model: torch.nn.Module
    if args.path == PATHS[args.init][-1]:
        model = build(config, cast(Any, _Session(rank, world_size, device)))[0]
    elif args.path == "meta-broadcast":
        model = _meta_broadcast(config, device, rank, world_size)
    else:
        model = _every_rank_full(config, device, world_size)
    dist.barrier()
    record = {
        "rank": rank,
        "build_s": round(time.perf_counter() - start, 2),
        "rss_before_build_gib": round(rss_before / GIB, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3),
        "peak_gpu_allocated_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 3) if cuda else None,
        "sharded_parameters": sum(cast(DTensor, p).to_local().numel() for p in model.parameters()),
    }
    records: list[Any] = [None] * world_size
    dist.all_gather_object(records, record)
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(records), flush=True)
    dist.destroy_process_group()


def write_pretrained(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM

    from training.model.causal_lm import load_architecture

    config = _config(argparse.Namespace(**{**vars(args), "init": "random", "model_id": None}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(load_architecture(config), dtype=torch.bfloat16)
    model.save_pretrained(args.write_pretrained)


def with_layers(model_config: str, layers: int, folder: str) -> str:
    """A JSON copy of the architecture with `layers` decoder layers (a smaller model of the same
    widths and vocabulary, whose embedding dominates as at full depth)."""
    from training.config.run_config import load_model_config

    values = {**load_model_config(model_config), "num_hidden_layers": layers, "max_window_layers": layers}
    path = os.path.join(folder, f"{layers}-layers.json")
    with open(path, "w") as handle:
        json.dump(values, handle)
    return path


def run_path(args: argparse.Namespace, path: str) -> list[dict[str, Any]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
        "-m", "bench.load_memory", "--worker", path, "--out", args.out, "--model-config", args.model_config,
        "--init", args.init, *(["--model-id", args.model_id] if args.model_id else []),
        *(["--cpu"] if args.cpu else []),
    ]  # fmt: skip
    # The ranks' stderr (warnings, a traceback) goes straight to this process's.
    output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    line = next(line for line in output.splitlines() if line.startswith(RESULT_PREFIX))
    return json.loads(line.removeprefix(RESULT_PREFIX))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument(
        "--model-config", default="qwen2.5-1.5b", help="a name in training/architectures or a JSON file"
    )
    parser.add_argument("--init", default="random", choices=("random", "pretrained"))
    parser.add_argument("--model-id", help="for --init pretrained: a save_pretrained folder")
    parser.add_argument("--nproc", type=int, default=1, help="ranks (torchrun --nproc-per-node)")
    parser.add_argument("--cpu", action="store_true", help="gloo on the host even where CUDA is present")
    parser.add_argument("--write-pretrained", help="first save random bf16 weights here (save_pretrained)")
    parser.add_argument("--num-hidden-layers", type=int, help="override the architecture's depth")
    parser.add_argument("--worker", choices=PATHS["pretrained"], dest="path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        worker(args)
        return
    folder = tempfile.mkdtemp()
    if args.num_hidden_layers:
        args.model_config = with_layers(args.model_config, args.num_hidden_layers, folder)
    if args.write_pretrained:
        write_pretrained(args)
    import transformers

    cuda = torch.cuda.is_available() and not args.cpu
    result = {
        "command": "python -m bench.load_memory " + shlex.join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "baseline": "every-rank-full",
        "loop_path": PATHS[args.init][-1],
        "paths": {path: run_path(args, path) for path in PATHS[args.init]},
    }
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result["paths"]))


if __name__ == "__main__":
    main()
