"""What the node types must be: an architecture the node group's EKS AMI boots, and EFA on the GPU type."""

from __future__ import annotations

from infra.aws_rules.ami_types import AMI_ARCHITECTURE
from infra.aws_rules.capacity_rules import (
    has_efa,
)
from infra.aws_rules.sizing import InstanceFacts
from infra.config.stack import ConfigError
from infra.preflight.errors import PreflightError


def require_architecture(node: InstanceFacts, key: str, ami_type: str) -> None:
    architecture = AMI_ARCHITECTURE[ami_type]
    if architecture not in node.architectures:
        raise ConfigError(
            f"config key '{key}' = {node.instance_type!r}: its CPU architecture is {', '.join(node.architectures)}, "
            f"and the node group boots the EKS AMI {ami_type}, built for {architecture}: pick an {architecture} "
            "instance type (g6.12xlarge for GPUs, m7i.xlarge for the system nodes)"
        )


def require_efa(gpu_node: InstanceFacts, region: str) -> None:
    if not has_efa(gpu_node.efa_supported, gpu_node.efa_interfaces):
        raise PreflightError(
            f"config key 'gpuNodeType' = {gpu_node.instance_type!r} does not support EFA, so NCCL would fall back to TCP between the "
            "nodes: pick an EFA-capable GPU type such as g6.12xlarge, g6e.12xlarge, g5.12xlarge, p4d.24xlarge or "
            f"p5.48xlarge (list them with `aws ec2 describe-instance-types --region {region} --filters "
            "Name=network-info.efa-supported,Values=true --query 'InstanceTypes[?GpuInfo].InstanceType'`)"
        )
