"""The node repair figures: the replacement bound the job's restart waits for, and the agent's configuration."""

from __future__ import annotations

from ray.train.v2._internal import constants

from infra.aws_rules.node_repair import (
    ACCELERATED_HARDWARE_REPAIR_AFTER_S,
    NODE_REPLACEMENT_S,
    addon_configuration,
)
from platform_contract import GPU_TOLERATION


def test_a_restarted_worker_group_outwaits_rays_default_and_a_gpu_repairs_wait():
    """Ray Train's 60 s for a worker group to start meets no replaced node; the bound is longer than
    EKS's own wait before it repairs a node with a GPU fault (10 min), plus the launch."""
    assert NODE_REPLACEMENT_S > constants.DEFAULT_WORKER_GROUP_START_TIMEOUT_S
    assert NODE_REPLACEMENT_S > ACCELERATED_HARDWARE_REPAIR_AFTER_S


def test_the_agents_configuration_names_only_its_dcgm_servers_toleration():
    assert addon_configuration() == {"dcgmAgent": {"tolerations": [GPU_TOLERATION]}}
