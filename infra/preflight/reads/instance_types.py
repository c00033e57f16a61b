"""An EC2 instance type's facts, read at preview through the AWS provider
(`ec2:DescribeInstanceTypes`); what the pods' sizes make of them is `infra.aws_rules.sizing`."""

from __future__ import annotations

import pulumi_aws as aws

from infra.aws_rules.sizing import InstanceFacts, eks_max_pods
from infra.config.stack import ConfigError


def describe_instance_type(instance_type: str, key: str, region: str) -> InstanceFacts:
    """Look the type up through the AWS provider (runs during `pulumi preview`)."""
    try:
        result = aws.ec2.get_instance_type(instance_type=instance_type)
    except Exception as err:  # the provider reports unknown types as an invoke error
        raise ConfigError(
            f"config key '{key}' = {instance_type!r}: AWS does not know this instance type in {region} ({err}); "
            f"check the name with `aws ec2 describe-instance-types --region {region} --instance-types {instance_type}`"
        ) from None
    gpus = result.gpuses or []
    return InstanceFacts(
        instance_type=instance_type,
        vcpus=int(result.default_vcpus),
        memory_mib=int(result.memory_size),
        gpus=sum(int(gpu.count) for gpu in gpus),
        gpu_name=f"{gpus[0].manufacturer} {gpus[0].name}" if gpus else None,
        gpu_memory_mib=int(result.total_gpu_memory or 0),
        efa_supported=bool(result.efa_supported),
        efa_interfaces=int(result.efa_maximum_interfaces or 0),
        network_cards=int(result.maximum_network_cards or 1),
        max_pods=eks_max_pods(
            int(result.maximum_network_interfaces or 1), int(result.maximum_ipv4_addresses_per_interface or 2)
        ),
        architectures=tuple(result.supported_architectures or ()),
        ipv4_per_interface=int(result.maximum_ipv4_addresses_per_interface or 2),
        network_performance=result.network_performance or "",
    )
