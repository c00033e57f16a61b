"""The node groups' EKS AMI types, each with the architecture it is built for."""

from __future__ import annotations

from infra.aws_rules.ami_types import AMI_ARCHITECTURE, GPU_AMI_TYPE, SYSTEM_AMI_TYPE


def test_each_ami_type_the_node_groups_boot_names_the_architecture_it_is_built_for():
    """EKS names an AMI type after its architecture (`AL2023_x86_64_NVIDIA`, `AL2023_ARM_64_STANDARD`)."""
    assert set(AMI_ARCHITECTURE) == {SYSTEM_AMI_TYPE, GPU_AMI_TYPE}
    assert all(f"_{architecture}_" in ami_type for ami_type, architecture in AMI_ARCHITECTURE.items())
