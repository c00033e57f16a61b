"""What no single key decides (`infra.config.cross_keys`): keys that contradict each other, and the
image's digest on a stack that is not a dev stack (a tag's is read at preview; one given must be sha256)."""

from __future__ import annotations

import pytest

from infra.config.cross_keys import moving_tag_warning
from infra.config.stack import DEFAULT_IMAGE, ConfigError, parse_settings
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
@pytest.mark.parametrize("image", [None, "rayproject/ray:2.58.0-py311-gpu"])
def test_a_stack_that_is_not_dev_takes_a_tag_whose_digest_the_preview_reads(stack, image):
    """Issue 60: the tag's digest is read from the registry at preview (`infra.aws_rules.image_pins`)."""
    values = {**CIDRS, **({"image": image} if image else {})}
    assert parse_settings(values, "us-east-2", stack=stack).image == (image or DEFAULT_IMAGE)


@pytest.mark.parametrize("stack", ["us-east-1", "prod", "devices", "development"])
@pytest.mark.parametrize(
    "image, tag",
    [
        ("rayproject/ray@sha256:" + "A" * 64, "rayproject/ray:<tag>"),
        ("rayproject/ray:2.58.0-py311-gpu@sha512:" + "0" * 128, "rayproject/ray:2.58.0-py311-gpu"),
    ],
)
def test_a_stack_that_is_not_dev_refuses_a_digest_other_than_sha256(stack, image, tag):
    with pytest.raises(ConfigError) as raised:
        parse_settings({**CIDRS, "image": image}, "us-east-2", stack=stack)
    refusal = str(raised.value)
    assert refusal.startswith(f"config key 'image' = {image!r} has a digest other than sha256"), refusal
    assert f"stack {stack!r} is not a dev stack" in refusal and "\n" not in refusal
    assert f"`pulumi config set image {tag}`" in refusal and "crane" not in refusal


def test_the_tag_warning_speaks_for_a_dev_stack_and_says_how_to_pin_without_crane():
    warning = moving_tag_warning(DEFAULT_IMAGE)
    assert warning is not None and warning.startswith(f"config key 'image' = {DEFAULT_IMAGE!r} is a tag")
    assert f"`pulumi config set image {DEFAULT_IMAGE}@sha256:<digest>`" in warning and "crane" not in warning
    assert moving_tag_warning(DEFAULT_IMAGE, "dev-alice") == warning
    assert moving_tag_warning(DEFAULT_IMAGE, "prod") is None
    assert moving_tag_warning(f"{DEFAULT_IMAGE}@{DIGEST}") is None


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
