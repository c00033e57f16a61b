"""Checkpoints written and read in place in an object store (training/components/storage.py), against a
real S3 API (moto's server, tests/harness/s3_server.py) reached through `AWS_ENDPOINT_URL` as the pods
reach S3: the shards as objects, a resume that reads byte ranges, a checkpoint missing a shard or
holding a short one found out, and a write whose upload is refused never committed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch

from tests.harness.s3_server import Refusal, S3Server
from training.components import storage
from training.components.async_checkpoint import CHECKPOINT_STEP_KEY, CheckpointWriter
from training.components.checkpoint import (
    is_complete,
    load_checkpoint,
    not_whole,
    read_train_state,
    resume_point,
    save_checkpoint,
)
from training.components.storage import MAX_RANGE_BYTES, merged_ranges
from training.distributed.ballot import StepBallot

BUCKET = "runs"
RUN = f"s3://{BUCKET}/run"


@pytest.fixture
def s3(monkeypatch) -> Iterator[S3Server]:
    server = S3Server().start()
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    server.create_bucket(BUCKET)
    yield server
    server.stop()


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_checkpoint_is_written_as_objects_under_the_run_and_read_back_by_byte_range(s3, one_rank_group):
    model, optimizer = model_and_optimizer(0)
    location = storage.join(RUN, "checkpoint_000003")
    save_checkpoint(location, model, optimizer, {"step": 3}, rank=0)
    filesystem, path = storage.resolve(location)
    objects = {info.base_name for info in filesystem.get_file_info(pafs.FileSelector(path))}
    assert {".metadata", "__0_0.distcp", "train_state.json"} <= objects
    assert not not_whole(location) and read_train_state(location) == {"step": 3}
    # Nothing was staged on this machine's disk and uploaded again: every shard went up once.
    assert [request.status for request in s3.of("PUT", r"__0_0\.distcp")] == [200]

    restored, restored_optimizer = model_and_optimizer(1)
    before = len(s3.requests)
    load_checkpoint(location, restored, restored_optimizer)
    assert torch.equal(restored.weight, model.weight)
    reads = [
        request for request in s3.requests[before:] if request.method == "GET" and "distcp" in request.key
    ]
    assert reads and all(request.ranged and request.status == 206 for request in reads)


def test_a_missing_or_short_shard_makes_a_checkpoint_not_whole_and_a_resume_takes_the_one_before(
    s3, one_rank_group, capsys
):
    model, optimizer = model_and_optimizer(0)
    for step in (2, 4, 6):
        save_checkpoint(storage.join(RUN, f"checkpoint_{step:06d}"), model, optimizer, {"step": step}, rank=0)
    filesystem, run = storage.resolve(RUN)
    filesystem.delete_file(f"{run}/checkpoint_000006/__0_0.distcp")
    with filesystem.open_output_stream(f"{run}/checkpoint_000004/__0_0.distcp") as stream:
        stream.write(b"cut")
    assert not_whole(storage.join(RUN, "checkpoint_000006")) == ["__0_0.distcp: missing"]
    (short,) = not_whole(storage.join(RUN, "checkpoint_000004"))
    assert short.startswith("__0_0.distcp: 3 of ") and short.endswith(" bytes")
    point = resume_point(storage.join(RUN, "checkpoint_000006"), RUN)
    assert point.location == storage.join(RUN, "checkpoint_000002")
    assert point.line == (
        f"checkpoint {RUN}/checkpoint_000006 is not whole (__0_0.distcp: missing): resuming from the newest "
        f"whole one, {RUN}/checkpoint_000002"
    )


@pytest.mark.slow  # the AWS SDK's retries of a refused part take some 7 s
def test_a_refused_upload_raises_when_its_object_is_closed(s3):
    s3.refusals.append(Refusal("PUT", r"/refused\.bin$"))
    filesystem, path = storage.resolve(storage.join(RUN, "refused.bin"))
    with pytest.raises(OSError), storage.ArrowFileSystem(filesystem).create_stream(path, "wb") as stream:
        stream.write(b"x" * 1024)
    assert s3.refusals[0].refused >= 1
    assert filesystem.get_file_info(path).type == pafs.FileType.NotFound


class _Published:
    """The writer's session: checkpoints in the run's folder in S3, each report and publish logged."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def checkpoint_folder(self, step: int) -> str:
        return storage.join(RUN, f"checkpoint_{step:06d}")

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        self.calls.append(("publish", metrics["step"], metrics[CHECKPOINT_STEP_KEY], folder))

    def report(self, metrics: dict[str, Any], step: int, save: Any) -> None:
        self.calls.append(("report", step))


@pytest.mark.slow  # the AWS SDK's retries of a refused part take some 7 s
def test_a_write_whose_shard_upload_is_refused_is_never_committed_and_the_run_trains_on(s3, one_rank_group):
    """The upload of step 2's shard is refused every time: the commit finds the write failed, says
    so in one line, removes the folder and reports the step alone; step 4's write commits, naming
    the step it holds, and is the checkpoint a restart resumes from."""
    s3.refusals.append(Refusal("PUT", r"checkpoint_000002/__0_0\.distcp"))
    model, optimizer = model_and_optimizer(0)
    session, lines = _Published(), []
    writer = CheckpointWriter(session, model, optimizer, 0.0, torch.device("cpu"), log=lines.append)
    ballot = StepBallot()
    writer.register(ballot)
    for step in range(1, 7):
        ballot.receive([1.0, 0.0])  # the one rank's write, if any, has ended: it waits for it
        writer.count(ballot)
        state = {"step": step} if step in (2, 4) else None
        writer.report({"step": step}, step, state=state, last=False, save=None)
    writer.close()
    assert ("publish", 5, 4, storage.join(RUN, "checkpoint_000004")) in session.calls
    assert not any(call[0] == "publish" and call[2] == 2 for call in session.calls)
    dropped = [line for line in lines if line.startswith("checkpoint of step 2 not committed")]
    assert len(dropped) == 1 and "a restart resumes from the checkpoint committed before it" in dropped[0]
    assert not storage.folders(RUN, "checkpoint_000002")
    assert is_complete(storage.join(RUN, "checkpoint_000004"))
    assert resume_point(storage.join(RUN, "checkpoint_000004"), RUN).location == storage.join(
        RUN, "checkpoint_000004"
    )


def test_a_rank_reads_its_own_shards_in_large_ranges_and_anothers_items_alone():
    """The cluster's layout: a rank's own 2.25 GiB of contiguous items (1,000 of 2.3 MiB), and in another
    rank's file the replicated 8-byte items DCP stored there once, one every 2.3 MiB."""
    own = [(index * 2_411_724, 2_411_724) for index in range(1000)]
    ranges = merged_ranges(own)
    assert len(ranges) == 38 and all(end - start <= MAX_RANGE_BYTES for start, end in ranges)
    assert ranges[0][0] == 0 and ranges[-1][1] == 1000 * 2_411_724
    others = [(index * 2_411_724 + 100, 8) for index in range(1000)]
    assert merged_ranges(others) == [(offset, offset + 8) for offset, _ in others]
