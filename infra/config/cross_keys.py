"""What no single key decides: values of the stack that contradict each other, or the stack's kind.

`across_keys` runs after every key has parsed (`infra.config.stack.parse_settings`); the image's
pin rules are also the warning `load_settings` logs (`infra.config.pulumi_source`). A tag on a stack
that is not dev is no refusal: the preview reads its digest from the registry
(`infra.preflight.reads.image_digests`).
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
    refusal = image_digest_refusal(settings.image, stack)
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


def _repository_and_tag(image: str) -> str:
    """The reference without its digest, `<repository>:<tag>` where it names a tag."""
    name = image.split("@", 1)[0]
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:<tag>"


def moving_tag_warning(image: str, stack: str | None = None) -> str | None:
    """A tag can be moved to other bits (AWS's `train-ml-cuda-v1.1` follows patch releases); a node
    replaced later could pull another Ray than the head runs, which Ray does not survive. A dev stack
    runs the tag, with this warning; any other runs the digest its first deploy read (no warning
    where `stack` says it is one)."""
    if "@" in image or (stack is not None and not is_dev_stack(stack)):
        return None
    return (
        f"config key 'image' = {image!r} is a tag, which its publisher can move: a dev stack runs the tag, so a "
        "node replaced later may run other bits than the head (a stack that is not dev runs the digest its first "
        f"deploy read from the registry). To pin it here too: `pulumi config set image {image}@sha256:<digest>` "
        f"(`docker buildx imagetools inspect {image}` prints the digest)"
    )


def image_digest_refusal(image: str, stack: str) -> str | None:
    """Every stack but a dev one runs its image by a sha256 digest: a tag's is read at the first
    deploy's preview (`infra.preflight.reads.image_digests`), and a digest given must be a sha256 one, the
    algorithm registries name manifests by."""
    if "@" not in image or is_dev_stack(stack):
        return None
    problem = image_digest_problem(image)
    if problem is None:
        return None
    return (
        f"config key 'image' = {image!r} {problem}; stack {stack!r} is not a dev stack (dev, dev-*, *-dev), so it "
        f"runs its image by a sha256 digest: set the tag (`pulumi config set image {_repository_and_tag(image)}`), "
        "whose digest the preview reads from the registry, or its sha256 digest"
    )
