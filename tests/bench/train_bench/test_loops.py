"""The loops measured, on the CPU with the tiny architecture: the tuned loop (`training.loop`
itself) on the benchmark's rows of isolated documents, and the tuned step closure the profile
times, each on a one-rank gloo group."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from bench.train_bench.loops import tuned_loop, tuned_run, tuned_step
from bench.train_bench.variants import tuned_config

# The variant shape the bench reads (bench.train_bench.variants): small enough for the CPU.
TINY_SHAPE = {"seq_len": 32, "batch_size": 2, "compile": False, "documents": 4}


@pytest.fixture
def group_ends():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_tuned_loop_trains_the_sessions_rows_of_documents_and_keeps_each_steps_record(group_ends):
    config = tuned_config("tiny", 2, TINY_SHAPE)
    assert config.data == "bench-document-rows"  # the rows come from the session, not a corpus
    session = tuned_run(config, torch.device("cpu"), TINY_SHAPE)
    assert session.rows is not None and session.rows.shape == (2 * 2, 32 + 1)
    assert session.summary is not None and [record["step"] for record in session.history] == [1, 2]
    assert tuned_loop(config, torch.device("cpu"), TINY_SHAPE)["steps"] == session.summary["steps"]


def test_the_tuned_step_closure_returns_each_steps_loss_as_a_tensor(group_ends):
    step = tuned_step("tiny", torch.device("cpu"), TINY_SHAPE)
    losses = [step() for _ in range(2)]
    assert all(isinstance(loss, torch.Tensor) and math.isfinite(loss.item()) for loss in losses)
