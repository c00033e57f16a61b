"""Each key on its own (`infra.config.key_parsers`): the shapes, the limits AWS sets, and bad values
refused naming the key and the fix."""

from __future__ import annotations

import json

import pytest

from infra.config.stack import ConfigError, parse_settings
from tests.harness.stack_values import CIDRS, parse

# --- shapes: whole values only ---------------------------------------------------------------------

# A good value of each key a shape check guards. `$` in a pattern also matches before a trailing
# newline, so each shape must match the whole value: `training.runName: "exp1\n"` would otherwise
# put a second line into the job's command, which Ray runs through a shell on the head pod.
SHAPED_KEYS = {
    "clusterName": "eks-ray-train",
    "kubernetesVersion": "1.36",
    "systemNodeType": "m7i.xlarge",
    "gpuNodeType": "g6.12xlarge",
    "gpuAz": "us-east-2a",
    "capacityReservationId": "cr-0123456789abcdef0",
    "image": "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
    "rayVersion": "2.58.0",
    "namespace": "ray-train",
}
TRAILING = ["\n", "\t", " "]


def test_the_shaped_keys_take_their_good_values():
    parse(**SHAPED_KEYS, adminPrincipalArns=json.dumps(["arn:aws:iam::123456789012:role/ci"]))
    parse(training={"runName": "exp1", "expectTransport": "efa"})
    assert parse(training={"minBusbwFraction": 0.8}).training.min_busbw_fraction == 0.8


@pytest.mark.parametrize("suffix", TRAILING, ids=["newline", "tab", "space"])
@pytest.mark.parametrize("key", sorted(SHAPED_KEYS))
def test_a_shaped_key_with_trailing_whitespace_is_refused_naming_it(key, suffix):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse(**{key: SHAPED_KEYS[key] + suffix})


@pytest.mark.parametrize("suffix", TRAILING, ids=["newline", "tab", "space"])
def test_whitespace_after_a_principal_region_or_run_name_is_refused(suffix):
    with pytest.raises(ConfigError, match="'adminPrincipalArns'"):
        parse(adminPrincipalArns=json.dumps([f"arn:aws:iam::123456789012:role/ci{suffix}"]))
    with pytest.raises(ConfigError, match="'aws:region'"):
        parse_settings(CIDRS, f"us-east-2{suffix}", stack="dev")
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": f"exp1{suffix}"})
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": f"exp1{suffix}rm -rf /"})


@pytest.mark.parametrize(
    "image, reason",
    [
        ("public.ecr.aws/deep-learning-containers/Ray:train-ml-cuda-v1.1", "must be lowercase"),
        ("RayProject/ray:2.58.0", "must be lowercase"),
        ("rayproject/ray:2.58.0\tx", "no spaces, tabs or newlines"),
    ],
)
def test_an_image_reference_oci_refuses_is_refused(image, reason):
    with pytest.raises(ConfigError, match=reason):
        parse(image=image)


def test_a_registry_host_may_have_capitals():
    assert parse(image="Registry.example.com:5000/team/ray:2.58.0").image.startswith("Registry")


def test_a_namespace_longer_than_a_kubernetes_label_is_refused():
    parse(namespace="n" * 63)
    with pytest.raises(ConfigError, match="'namespace'"):
        parse(namespace="n" * 64)


# --- who may reach the API ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cidrs, reason",
    [
        (["0.0.0.0/0"], "cover every address"),
        (["0.0.0.0/1", "128.0.0.0/1"], "cover every address"),
        (["::/1", "8000::/1"], "cover every address"),
        (["10.0.0.0/16"], "10.0.0.0/16 is within 10.0.0.0/8"),
        (["203.0.113.7/32", "192.168.1.0/24"], "192.168.1.0/24 is within 192.168.0.0/16"),
        (["100.64.0.1/32"], "within 100.64.0.0/10"),
        ([f"198.51.100.{i}/32" for i in range(41)], "41 blocks: EKS takes at most 40"),
    ],
)
def test_public_access_cidrs_eks_would_refuse_or_that_open_everything_are_refused(cidrs, reason):
    with pytest.raises(ConfigError, match="'endpointPublicAccessCidrs'") as raised:
        parse(endpointPublicAccessCidrs=json.dumps(cidrs))
    assert reason in str(raised.value)


def test_forty_public_blocks_are_the_most_eks_takes():
    cidrs = [f"198.51.100.{i}/32" for i in range(40)]
    assert len(parse(endpointPublicAccessCidrs=json.dumps(cidrs)).endpoint_public_access_cidrs) == 40


@pytest.mark.parametrize(
    "cidr, reason", [("172.17.0.0/16", "the Docker bridge"), ("169.254.0.0/16", "link-local")]
)
def test_a_vpc_block_aws_warns_against_is_refused(cidr, reason):
    with pytest.raises(ConfigError, match=f"'vpcCidr' = '{cidr}': overlaps {cidr}, {reason}"):
        parse(vpcCidr=cidr)
