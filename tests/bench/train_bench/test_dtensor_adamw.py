"""The `-dtensor-adamw` variants build torch's AdamW, and only inside their block."""

from __future__ import annotations

import torch

from bench.train_bench.dtensor_adamw import with_dtensor_adamw
from tests.harness.build_session import BuildSession
from training.build import build
from training.components.optim import ShardLocalAdamW
from training.config.run_config import parse_args


def test_the_variant_builds_torchs_adamw_with_the_jobs_groups_and_the_job_its_own_after(one_rank_group):
    config = parse_args(["--preset", "tiny"])
    session = BuildSession(0, 1, 1, torch.device("cpu"))
    with with_dtensor_adamw():
        _, variant, _, _ = build(config, session)
    _, job, _, _ = build(config, session)
    assert type(variant) is torch.optim.AdamW and type(job) is ShardLocalAdamW
    assert [group["weight_decay"] for group in variant.param_groups] == [
        group["weight_decay"] for group in job.param_groups
    ]
    assert [len(group["params"]) for group in variant.param_groups] == [
        len(group["params"]) for group in job.param_groups
    ]
