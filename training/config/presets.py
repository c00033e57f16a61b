"""The presets: each gives a value to every setting but --preset, --local, --storage-path and
--run-name; flags override it (no torch, no ray)."""

from __future__ import annotations

from typing import Any

from training.config.corpus_files import DEFAULT_TEXT_COLUMN, SHIPPED_CORPUS, SYNTHETIC

DEFAULT_PRESET = "tiny"
QWEN_1_5B = "Qwen/Qwen2.5-1.5B"
# The --tokenizer value of the byte-level tokenizer (training/data/tokenizer.py): no download.
BYTE_TOKENIZER = "bytes"

_BASE: dict[str, Any] = {
    "model_id": QWEN_1_5B,
    "model_config": "qwen2.5-1.5b",
    "init": "pretrained",
    "tokenizer": QWEN_1_5B,
    "data": SYNTHETIC,
    "eval_data": None,
    "eval_every": 0,
    "corpus_cache": None,
    "text_column": DEFAULT_TEXT_COLUMN,
    "document_attention": "auto",
    "attention": "auto",
    "grad_accum_steps": 1,
    "defer_grad_sync": False,
    "lr": 2e-5,
    "warmup_steps": 0,
    "lr_schedule": "constant",
    "min_lr_ratio": 0.0,
    "decay_ratio": 0.2,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "seed": 0,
    "workers": None,
    "use_gpu": True,
    "gpus_per_worker": 1.0,
    "cpus_per_worker": 1.0,
    "resume_from": None,
    "init_from": None,
    "checkpoint_every": 0,
    # Every few minutes: a fault loses at most that, plus a write in flight.
    "checkpoint_interval_s": 300.0,
    "keep_checkpoints": 2,
    "early_stop_patience": 0,
    "max_failures": 3,
    "recovery_budget_s": 1800.0,
    # A node whose faults repeat ends the run; on a cluster with node auto repair the TrainingRun
    # turns this on (`infra.config.training_settings.job_arguments`).
    "leave_failing_node": False,
    # Above a step's ordinary jitter (a garbage collection, a slow host, the step after a checkpoint
    # when a rank is still uploading is judged apart) and far below NCCL's 10-minute timeout.
    "hang_margin_s": 30.0,
    "hsdp_replicas": 1,
    "compile": False,
    "activation_checkpointing": False,
    "float8": False,
    "loss_chunk_tokens": 4096,
    "reshard_after_forward": True,
    "export_hf": False,
    "export_dtype": "bf16",
    "tensorboard": True,
    "line_rate_gbps": None,
    "deadline": None,
    "launcher": "ray",
}

PRESETS: dict[str, dict[str, Any]] = {
    # The CPU demo and test model: two tiny Qwen2 layers over bytes of the shipped corpus.
    "tiny": {
        **_BASE,
        "model_id": "tiny",
        "model_config": "tiny",
        "init": "random",
        "tokenizer": BYTE_TOKENIZER,
        "data": str(SHIPPED_CORPUS),
        "steps": 30,
        "seq_len": 128,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 3,
        "workers": 2,
        "use_gpu": False,
        "checkpoint_every": 10,
        "loss_chunk_tokens": 1024,
    },
    # AWS's reference job: seq 128, batch 1, 5 steps of random tokens, so the
    # EFA-vs-TCP measurements stay comparable with the published 0.2513/0.5173 steps/s.
    "smoke": {
        **_BASE,
        "steps": 5,
        "seq_len": 128,
        "batch_size": 1,
        "max_grad_norm": 0.0,
    },
    # Tuned for 2 x g6.12xlarge (8 x L4, 22.5 GiB usable each): shard inside a node,
    # replicate across nodes, compiled layers, fused loss, two 4096-token sequences per GPU
    # with activation checkpointing. Measured at world size 8 (fake process group,
    # bench/reports/memory_h200_202612.md): 10.1 GiB per rank and the fastest per-rank
    # rate of the HSDP candidates that fit (31.6k tokens/s on an H200, against 16.2k for one
    # sequence without checkpointing at 16.1 GiB); two sequences without checkpointing need
    # 25.1 GiB. HSDP rather than FSDP over all 8: only the gradient all-reduce crosses the
    # shared 40 Gbps link between the nodes, not every layer's all-gather and reduce-scatter.
    "throughput": {
        **_BASE,
        "steps": 50,
        "seq_len": 4096,
        "batch_size": 2,
        "warmup_steps": 10,
        "checkpoint_every": 0,
        "hsdp_replicas": 0,
        "compile": True,
        "activation_checkpointing": True,
    },
}
