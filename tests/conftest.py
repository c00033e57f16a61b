"""Fixtures shared by the tests (the program's plan of each stack file, the training tests' process
group and Ray head), and the tests' thread count.

One intra-op thread per process, as Ray gives each worker (OMP_NUM_THREADS=1): the tests spawn
several ranks or Ray workers on a 2-core machine, where a thread pool per process oversubscribes
the cores. Measured on that machine: the loss-normalisation, sharded-build and resume tests took
163 s with torch's default of 2 threads, 128 s with one, under more load; the worked fine-tune's
in-process run 95 s against 28 s. The numbers the tests compare do not depend on it (both sides of
each comparison run the same way). Set OMP_NUM_THREADS to override.
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from tests.harness.paths import REPO_ROOT


@pytest.fixture(autouse=True)
def stop_fake_readers():
    """Every fake node's EFA counter reader server a test started ends with the test."""
    yield
    if "tests.harness.fake_reader_node" in sys.modules:
        sys.modules["tests.harness.fake_reader_node"].FakeReaderNode.stop_all()


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group, for the loop's collectives outside any launcher."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def host(tmp_path):
    """The real Pulumi provider host alone (tests/harness/provider_host.py), for calls that reach no
    cluster: Check, Diff, Read, Delete; stopped with the test."""
    from tests.harness.provider_host import ProviderHost

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    host = ProviderHost(env, tmp_path / "provider-host.stderr").start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="session")
def ray_head():
    """The session's one `ray start --head` (tests/harness/ray_head.py), started by the first test that
    asks for it and stopped, with every process it started, when the session ends."""
    from tests.harness.ray_head import running_head

    with running_head() as head:
        yield head


@pytest.fixture(
    scope="session",
    params=sorted(REPO_ROOT.glob("Pulumi.*.yaml")),
    ids=lambda path: path.stem.split(".", 1)[1],
)
def stack_plan(request):
    """The program's plan of one stack file (its config, the `Preview`), run once per session and read by
    the tests of the whole program and of its components."""
    from tests.harness.fake_aws import FakeAws
    from tests.harness.program import config_of, run_program

    config = config_of(request.param)
    return config, run_program(
        config, FakeAws(region=config["aws:region"]), stack=request.param.stem.split(".", 1)[1]
    )
