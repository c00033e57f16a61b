"""The `aws:` credential settings (`infra.config.aws_identity`) as a stack gives them: what the
kubeconfig's `aws eks get-token` cannot follow is refused at preview, naming the key."""

from __future__ import annotations

import json
import re

import pytest

from infra.config.stack import AwsIdentity, ConfigError, parse_settings
from tests.harness.stack_values import CIDRS


@pytest.mark.parametrize(
    "assume_roles, message",
    [
        (
            [{"roleArn": "arn:aws:iam::1:role/a"}, {"roleArn": "arn:aws:iam::1:role/b"}],
            "config key 'aws:assumeRoles': chains 2 roles",
        ),
        ([{"sessionName": "x"}], "config key 'aws:assumeRoles[0]': needs a roleArn"),
    ],
)
def test_aws_role_chains_the_kubeconfig_cannot_follow_are_refused(assume_roles, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(CIDRS, "us-east-2", {"assumeRoles": json.dumps(assume_roles)}, stack="dev")


def test_the_single_assume_role_key_reaches_the_kubeconfig_too():
    role = "arn:aws:iam::123456789012:role/deployer"
    identity = parse_settings(
        CIDRS, "us-east-2", {"assumeRole": json.dumps({"roleArn": role})}, stack="dev"
    ).aws_identity
    assert identity == AwsIdentity(profile=None, role_arn=role)


@pytest.mark.parametrize(
    "aws, key",
    [
        ({"accessKey": "AKIAEXAMPLE", "secretKey": "secret"}, "aws:accessKey"),
        ({"sharedCredentialsFiles": '["/x"]'}, "aws:sharedCredentialsFiles"),
        (
            {"assumeRoleWithWebIdentity": '{"roleArn": "arn:aws:iam::1:role/w"}'},
            "aws:assumeRoleWithWebIdentity",
        ),
    ],
)
def test_aws_settings_the_kubeconfig_cannot_use_are_refused_at_preview(aws, key):
    """The program's Kubernetes provider and the training run act as one identity; what the
    kubeconfig's `aws eks get-token` cannot use fails the preview, naming the key."""
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}': ")) as raised:
        parse_settings(CIDRS, "us-east-2", aws, stack="dev")
    assert "\n" not in str(raised.value) and "secret" not in str(raised.value)
