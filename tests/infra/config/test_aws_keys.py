"""The AWS provider's keys as the stack reads them (`infra.config.aws_keys`): the region and its
partition, the identity, and a provider key set in the project's namespace."""

from __future__ import annotations

import json

import pytest

from infra.config.stack import AwsIdentity, ConfigError, parse_settings
from tests.harness.stack_values import CIDRS, parse


def test_aws_identity_comes_from_the_aws_namespace():
    assert parse_settings(CIDRS, "us-east-2", stack="dev").aws_identity == AwsIdentity()
    role = "arn:aws:iam::123456789012:role/deployer"
    identity = parse_settings(
        CIDRS, "us-east-2", {"profile": "team", "assumeRoles": json.dumps([{"roleArn": role}])}, stack="dev"
    ).aws_identity
    assert identity == AwsIdentity(profile="team", role_arn=role)


def test_region_is_required():
    with pytest.raises(ConfigError, match="aws:region"):
        parse_settings(CIDRS, None, stack="dev")


@pytest.mark.parametrize("key", ["region", "profile", "assumeRole"])
def test_an_aws_setting_in_the_project_namespace_points_to_aws(key):
    with pytest.raises(
        ConfigError, match=f"'eks-ray-train:{key}' is a setting of the AWS provider: set 'aws:{key}'"
    ):
        parse(**{key: "x"})


@pytest.mark.parametrize("region, partition", [("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")])
def test_a_region_outside_the_aws_partition_is_refused_with_the_reason(region, partition):
    with pytest.raises(ConfigError, match=f"'aws:region' = '{region}' is in the {partition} partition"):
        parse_settings(CIDRS, region, stack="dev")
