"""What no single key decides (`infra.config.cross_keys`): keys that contradict each other, and the
image a stack that is not a dev stack must pin by digest."""

from __future__ import annotations

import pytest

from infra.config.stack import ConfigError, parse_settings
from tests.harness.stack_values import CIDRS, parse


def test_public_endpoint_needs_cidrs():
    with pytest.raises(ConfigError, match="'endpointPublicAccessCidrs' is required"):
        parse_settings({}, "us-east-2", stack="dev")


def test_a_private_endpoint_needs_no_cidrs_and_refuses_them():
    """Whether this machine reaches the private endpoint is the preview's to check (`test_program_day_two.py`)."""
    settings = parse_settings({"endpointPublicAccess": "false"}, "us-east-2", stack="dev")
    assert settings.endpoint_public_access is False and settings.endpoint_public_access_cidrs == ()
    with pytest.raises(
        ConfigError, match=r"'endpointPublicAccessCidrs' limits the public API endpoint.*config rm"
    ):
        parse(endpointPublicAccess="false")
    assert parse(endpointPublicAccess="true").endpoint_public_access


DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize("stack", ["us-east-1", "prod", "devices", "development"])
@pytest.mark.parametrize(
    "image, problem",
    [
        (None, "(the default) is a tag"),
        ("rayproject/ray:2.58.0-py311-gpu", "is a tag"),
        ("rayproject/ray@sha256:" + "A" * 64, "has a digest other than sha256"),
        ("rayproject/ray@sha512:" + "0" * 128, "has a digest other than sha256"),
    ],
)
def test_a_stack_that_is_not_dev_refuses_an_image_without_a_sha256_digest(stack, image, problem):
    values = {**CIDRS, **({"image": image} if image else {})}
    with pytest.raises(ConfigError) as raised:
        parse_settings(values, "us-east-2", stack=stack)
    refusal = str(raised.value)
    assert refusal.startswith("config key 'image' = ") and problem in refusal, refusal
    assert f"stack {stack!r} is not a dev stack" in refusal and "\n" not in refusal
    for how in ("docker buildx imagetools inspect", "crane digest", "aws ecr describe-images"):
        assert how in refusal
    assert "`pulumi config set image " in refusal and "@sha256:<digest>`" in refusal


@pytest.mark.parametrize("stack", ["dev", "dev-alice", "alice-dev"])
def test_a_dev_stack_may_run_a_tag(stack):
    assert parse_settings(CIDRS, "us-east-2", stack=stack).image.endswith(":train-ml-cuda-v1.1")


def test_an_image_by_digest_runs_on_any_stack_and_keeps_the_default_images_ray_check():
    pinned = f"public.ecr.aws/deep-learning-containers/ray@{DIGEST}"
    assert parse_settings({**CIDRS, "image": pinned}, "us-east-2", stack="prod").image == pinned
    tagged_and_pinned = f"public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1@{DIGEST}"
    with pytest.raises(ConfigError, match=r"the default image carries Ray 2\.58\.0"):
        parse_settings(
            {**CIDRS, "image": tagged_and_pinned, "rayVersion": "2.57.0"}, "us-east-2", stack="prod"
        )
    assert (
        parse_settings({**CIDRS, "image": tagged_and_pinned}, "us-east-2", stack="prod").image
        == tagged_and_pinned
    )


def test_a_benchmark_without_training_is_refused():
    assert parse(benchmark="true").benchmark
    with pytest.raises(ConfigError, match="'benchmark' = true needs train: true"):
        parse(benchmark="true", train="false")


def test_a_ray_without_token_authentication_is_refused_naming_the_version_it_needs():
    """The RayCluster turns on Ray's token authentication, which KubeRay refuses below Ray 2.52.0
    (kuberay v1.7.0 ray-operator/controllers/ray/utils/validation.go): the preview says so first."""
    with pytest.raises(ConfigError) as caught:
        parse(image="rayproject/ray:2.51.2-py311-gpu", rayVersion="2.51.2")
    assert str(caught.value) == (
        "config key 'rayVersion' = '2.51.2': the RayCluster turns on Ray's token authentication, which "
        "Ray has since 2.52.0 (KubeRay refuses it below): use an image with Ray 2.52.0 or later"
    )
    assert parse(image="rayproject/ray:2.52.0-py311-gpu", rayVersion="2.52.0").ray_version == "2.52.0"
