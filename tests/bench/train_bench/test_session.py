"""The benchmark's process: the config every case starts from, its session (synthetic rows, no
checkpoints), its process group, its timing and its out-of-memory guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from bench.train_bench.session import (
    BenchSession,
    benchmark_config,
    start_process_group,
    timed_steps,
    unless_out_of_memory,
)


def test_the_benchmark_config_is_the_throughput_preset_without_checkpoints_or_tensorboard():
    config = benchmark_config("tiny", 3, seq_len=64, batch_size=1)
    assert (config.preset, config.model_config, config.steps) == ("throughput", "tiny", 3)
    assert (config.seq_len, config.batch_size) == (64, 1)  # the overrides win
    assert config.compile and config.activation_checkpointing  # the preset's, unless overridden
    assert config.init == "random" and config.resume_from is None
    assert config.tensorboard is False and config.checkpoint_interval_s == 0.0
    assert (config.local, config.launcher) == (False, "torchrun")


def test_the_session_is_rank_0_hands_over_its_rows_and_keeps_the_summary():
    rows = np.arange(2 * 9, dtype=np.int32).reshape(2, 9)
    session = BenchSession(8, 4, torch.device("cpu"), rows)
    assert (session.rank, session.world_size, session.local_world_size) == (0, 8, 4)
    corpus = session.corpus(benchmark_config("tiny", 1))
    assert corpus.rows is rows and corpus.fingerprint == "bench-documents"
    with session.latest_checkpoint() as latest:
        assert latest is None
    with session.open_checkpoint("s3://somewhere") as location:
        assert location == "s3://somewhere"
    assert session.faults() == []
    session.finish({"steps": 1}, [{"step": 1}])
    assert (session.summary, session.history) == ({"steps": 1}, [{"step": 1}])


def test_the_session_refuses_to_write_a_checkpoint():
    session = BenchSession(1, 1, torch.device("cpu"))
    with pytest.raises(AssertionError, match="no checkpoints"):
        session.checkpoint_folder(1)
    with pytest.raises(AssertionError, match="no checkpoints"):
        session.publish({}, 1, "folder")


def test_a_fake_group_has_the_world_size_asked_and_a_new_one_replaces_it():
    try:
        start_process_group("fake", 8, torch.device("cpu"))
        assert (dist.get_rank(), dist.get_world_size()) == (0, 8)
        start_process_group("fake", 4, torch.device("cpu"))
        assert dist.get_world_size() == 4
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_step_time_is_the_median_after_one_untimed_step_and_every_loss_is_read(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # the timed steps take 1 s, 3 s and 2 s
    monkeypatch.setattr("bench.train_bench.session.time.perf_counter", lambda: next(clock))
    losses = iter([4.0, 3.0, 2.0, 1.0])
    step_time, read = timed_steps(lambda: torch.tensor(next(losses)), 4)
    assert step_time == 2.0
    assert read == [4.0, 3.0, 2.0, 1.0]


def test_a_run_out_of_memory_gives_none_and_any_other_error_passes():
    assert unless_out_of_memory(lambda steps: {"steps": steps}, 3) == {"steps": 3}

    def out_of_memory() -> dict:
        raise torch.OutOfMemoryError("CUDA out of memory")

    assert unless_out_of_memory(out_of_memory) is None

    def broken() -> dict:
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        unless_out_of_memory(broken)
