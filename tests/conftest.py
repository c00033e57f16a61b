"""Fixtures shared by the training tests."""

import pytest


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group, for the loop's collectives outside any launcher."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
