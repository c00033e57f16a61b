"""What no single key decides: values of the stack that contradict each other, or the stack's kind.

`across_keys` runs after every key has parsed (`infra.config.stack.parse_settings`); the image's
pin rules are also the warning `load_settings` logs (`infra.config.pulumi_source`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from infra.config.key_parsers import DEFAULT_IMAGE, DEFAULT_RAY_VERSION
from infra.config.parsing import ConfigError
from platform_contract import image_digest_problem, is_dev_stack

if TYPE_CHECKING:
    from infra.config.stack import StackSettings

# Ray's own images carry the Ray version in the tag (rayproject/ray:2.58.0-py311-gpu); KubeRay
# starts the pods for `rayVersion`, and a Ray that differs from it fails at the head's start.
_RAY_IMAGE_TAG = re.compile(r"(?:.*/)?ray(?:-ml)?:(\d+\.\d+\.\d+)(?:[-.].*)?")
# The RayCluster turns on Ray's token authentication (`authOptions`), which Ray has since 2.52.0 and
# KubeRay refuses below it (kuberay v1.7.0 ray-operator/controllers/ray/utils/validation.go).
RAY_TOKEN_AUTH_SINCE = "2.52.0"


def version_key(version: str) -> tuple[int, ...]:
    """A dotted version (`1.35`, `2.52.0`) as numbers, to compare and sort by."""
    return tuple(int(part) for part in version.split("."))


def ray_version_problem(image: str, ray_version: str) -> str | None:
    """Why `rayVersion` cannot be the image's Ray, where the image says which Ray it has, or cannot
    run the RayCluster's token authentication."""
    if image.split("@", 1)[0] == DEFAULT_IMAGE and ray_version != DEFAULT_RAY_VERSION:
        return (
            f"the default image carries Ray {DEFAULT_RAY_VERSION}: remove rayVersion, or set image to an "
            f"image with Ray {ray_version}"
        )
    tagged = _RAY_IMAGE_TAG.fullmatch(image.split("@", 1)[0])
    if tagged and tagged.group(1) != ray_version:
        return f"the image {image} carries Ray {tagged.group(1)}: set rayVersion to {tagged.group(1)}"
    if version_key(ray_version) < version_key(RAY_TOKEN_AUTH_SINCE):
        return (
            f"the RayCluster turns on Ray's token authentication, which Ray has since {RAY_TOKEN_AUTH_SINCE} "
            f"(KubeRay refuses it below): use an image with Ray {RAY_TOKEN_AUTH_SINCE} or later"
        )
    return None


def across_keys(settings: StackSettings, stack: str) -> StackSettings:
    """What no single key decides: values that contradict each other, or the stack's kind."""
    region = settings.region
    refusal = image_tag_refusal(settings.image, stack)
    if refusal:
        raise ConfigError(refusal)
    if settings.gpu_az and not settings.gpu_az.startswith(region):
        raise ConfigError(
            f"config key 'gpuAz' = {settings.gpu_az!r} is not in region {region}: "
            f"pick one of the region's zones (e.g. {region}a) or remove the key to choose automatically"
        )
    if settings.benchmark and not settings.train:
        raise ConfigError(
            "config key 'benchmark' = true needs train: true (the comparison runs the training job over "
            "EFA, then over TCP): set train: true, or remove benchmark"
        )
    if settings.endpoint_public_access and not settings.endpoint_public_access_cidrs:
        raise ConfigError(
            "config key 'endpointPublicAccessCidrs' is required while the API endpoint is public: "
            "run `pulumi config set --path 'endpointPublicAccessCidrs[0]' $(curl -s https://checkip.amazonaws.com)/32`"
        )
    if not settings.endpoint_public_access and settings.endpoint_public_access_cidrs:
        raise ConfigError(
            "config key 'endpointPublicAccessCidrs' limits the public API endpoint, which endpointPublicAccess = "
            "false turns off: remove it (`pulumi config rm endpointPublicAccessCidrs`)"
        )
    ray_problem = ray_version_problem(settings.image, settings.ray_version)
    if ray_problem:
        raise ConfigError(f"config key 'rayVersion' = {settings.ray_version!r}: {ray_problem}")
    if settings.gpu_node_count == 1 and settings.train and settings.training.expect_transport != "intra-node":
        raise ConfigError(
            f"config keys 'gpuNodeCount' = 1 and 'training.expectTransport' = "
            f"{settings.training.expect_transport!r}: the workers of one node reach each other over "
            "NVLink or PCIe, never the network, so the run could only fail its transport check: "
            "set gpuNodeCount to 2 or more, or training.expectTransport: intra-node"
        )
    return settings


def _how_to_pin(image: str) -> str:
    """How to find an image's digest and pin it, for the warning and the refusal."""
    name = image.split("@", 1)[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return (
        f"`docker buildx imagetools inspect {image}` (or `crane digest {image}`; in your own ECR, `aws ecr "
        "describe-images --repository-name <name> --image-ids imageTag=<tag>`) prints it; then "
        f"`pulumi config set image {repository}@sha256:<digest>`"
    )


def moving_tag_warning(image: str) -> str | None:
    """A tag can be moved to other bits (AWS's `train-ml-cuda-v1.1` follows patch releases); a node
    replaced later could pull another Ray than the head runs, which Ray does not survive. A dev stack
    may run one, with this warning."""
    if "@" in image:
        return None
    return (
        f"config key 'image' = {image!r} is a tag, which its publisher can move: a node replaced later may run "
        f"other bits than the head. Pin the digest: {_how_to_pin(image)}"
    )


def image_tag_refusal(image: str, stack: str) -> str | None:
    """Every stack but a dev one runs its image by digest, the default's tag included."""
    problem = image_digest_problem(image)
    if problem is None or is_dev_stack(stack):
        return None
    default = " (the default)" if image == DEFAULT_IMAGE else ""
    return (
        f"config key 'image' = {image!r}{default} {problem}; stack {stack!r} is not a dev stack (dev, dev-*, "
        f"*-dev), so it runs its image by digest: {_how_to_pin(image)}"
    )
