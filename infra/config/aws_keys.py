"""The AWS provider's own keys as the stack reads them: the region and its partition, the identity
Pulumi acts as, and a provider key set in the project's namespace by mistake."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import botocore.exceptions
import botocore.session

from infra.config.aws_identity import AwsCredentialSettings, AwsSettingsError
from infra.config.parsing import ConfigError, did_you_mean
from platform_contract import PROJECT, REGION


@dataclass(frozen=True)
class AwsIdentity:
    """Who Pulumi acts as (`aws:profile`, `aws:assumeRoles`): everything that talks to the cluster uses it too."""

    profile: str | None = None
    role_arn: str | None = None


# Settings of the AWS provider (pulumi-aws's config schema) that people set in the project's namespace.
_AWS_PROVIDER_KEYS = ("region", "profile", "accessKey", "secretKey", "token", "assumeRole", "assumeRoles")


@functools.cache  # a botocore session loads its endpoint data: about 0.1 s a call otherwise
def _partition(region: str) -> str | None:
    """The AWS partition of a region, from botocore's endpoint data; None for a region it does not know."""
    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except botocore.exceptions.UnknownRegionError:
        return None


def check_keys(raw: Mapping[str, Any], known: Iterable[str]) -> None:
    """Unknown keys stop the preview with the closest known one (or the AWS provider's key)."""
    known = list(known)
    for key in raw:
        if key in known:
            continue
        if key in _AWS_PROVIDER_KEYS:
            raise ConfigError(
                f"config key '{PROJECT}:{key}' is a setting of the AWS provider: set 'aws:{key}' instead "
                f"(`pulumi config rm {key}`, then `pulumi config set aws:{key} ...`)"
            )
        raise ConfigError(f"unknown config key '{key}': {did_you_mean(key, known)}")


def aws_identity(aws: Mapping[str, Any]) -> AwsIdentity:
    """The profile and role the AWS provider uses (`aws:` keys without the namespace), as the
    cluster's kubeconfig can use them; the one parser of those keys is `infra.config.aws_identity`."""
    try:
        profile, role_arn = AwsCredentialSettings.from_config(
            {f"aws:{key}": value for key, value in aws.items()}
        ).kubeconfig_identity()
    except AwsSettingsError as err:
        raise ConfigError(f"config key '{err.key}': {err.reason}") from None
    return AwsIdentity(profile=profile, role_arn=role_arn)


def region_of(region: str | None) -> str:
    if not region:
        raise ConfigError("config key 'aws:region' is not set: run `pulumi config set aws:region us-east-2`")
    if not REGION.fullmatch(region):
        raise ConfigError(f"config key 'aws:region' = {region!r}: expected a region name such as us-east-2")
    partition = _partition(region)
    if partition not in (None, "aws"):
        raise ConfigError(
            f"config key 'aws:region' = {region!r} is in the {partition} partition: the program's IAM policy "
            "ARNs (arn:aws:iam::aws:policy/...), EKS access policy and default image (public.ecr.aws) are "
            "those of the aws partition; pick a region of the aws partition"
        )
    return region
