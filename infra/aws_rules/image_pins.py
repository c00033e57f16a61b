"""Images by digest outside dev stacks: each image tag resolved to its manifest's digest through the
registry's own API at the first deploy's preview, then kept on later `pulumi up`s (issue 60). Here
the judgements, pure functions over what was read: the references, the registries' challenges and
answers, what is kept, the messages; the reads are `infra.preflight.reads.image_digests`.

A tag can be moved by its publisher to other bits, so a node replaced later could pull other bits
than the rest run; a digest cannot. Every stack but a dev one (`dev`, `dev-*`, `*-dev`) therefore
runs the Ray image and the three charts' images (NVIDIA and EFA device plugins, KubeRay operator)
as `<repository>:<tag>@sha256:<digest>`; a dev stack runs the tags.

What an answer means, as a container runtime reads it before a pull:

- A `401` carries `WWW-Authenticate` challenges (RFC 7235 section 4.1; several may share one
  header). A `Bearer realm=...,service=...` one (Distribution's token authentication spec,
  distribution/distribution docs/content/spec/auth/token.md) names where a token for
  `scope=repository:<name>:pull` is asked for (`token_url`), answered as JSON with `token` or
  `access_token` (`token_of`).
- The digest is the `Docker-Content-Digest` header, which a successful answer SHOULD carry (the OCI
  distribution spec, "Checking if content exists in the registry" and "Pulling manifests"); where a
  HEAD answer lacks it, it is the sha256 of the manifest's bytes, checked against any header the GET
  answer carries (`manifest_digest`).

Kept: the digests are recorded in the stack output `images` (`PinnedImages.record`). A later
preview of a stack whose cluster runs reads that output back and keeps each digest while the
reference that named it stands (`recorded_digests`), as CoreDNS keeps its live version while
`kubernetesVersion` stands (`infra.resources.cluster.kept_addon_version`): a tag its publisher moved
changes nothing until asked. Asking is setting `image` to another tag or to a digest of your
choosing, a chart bump (its image tag changes), or `repinImages`, a value other than the recorded
one, which resolves every tag anew at the next preview.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from infra.config.key_parsers import parse_image_reference
from platform_contract import is_dev_stack

# The manifest types a digest may name, in the order of preference the client states: an index
# first, so a multi-platform tag answers with its index (OCI image-spec media-types.md; Docker's
# image manifest v2 schema 2, its "manifest list").
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
SHA256_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
# A private ECR registry: `<account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]`.
ECR_HOST = re.compile(r"\d{12}\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
# The stack key of the Ray image, as the messages name where an image is set.
IMAGE_KEY = "config key 'image'"
# The stack output that records the digests, and the key that asks for them anew.
RECORD_OUTPUT = "images"
REPIN_KEY = "repinImages"
# Registries cap a manifest at 4 MiB (OCI distribution spec, "Pushing Manifests": a registry MAY
# refuse larger ones); anything longer is not a manifest.
MANIFEST_MAX_BYTES = 4 * 1024 * 1024


# --- references ------------------------------------------------------------------------------------


def pinned_reference(reference: str, digest: str) -> str:
    """The reference as written, with the digest it runs by: `<repository>:<tag>@sha256:<digest>`. A
    runtime pulls the digest; the tag stays for people (and for `rayVersion`'s check of the tag)."""
    return f"{reference.partition('@')[0]}@{digest}"


# --- what is kept ----------------------------------------------------------------------------------


def recorded_digests(record: Any, repin: str | None) -> dict[str, str]:
    """The digests a stack recorded (its output `images`: tag reference -> digest) that still hold:
    none when `repin` is set to a value other than the one recorded with them. A record of another
    shape, or an entry that is no sha256 digest, counts as nothing recorded."""
    if not isinstance(record, Mapping) or (repin is not None and record.get(REPIN_KEY) != repin):
        return {}
    digests = record.get("digests")
    if not isinstance(digests, Mapping):
        return {}
    return {
        reference: digest
        for reference, digest in digests.items()
        if isinstance(reference, str) and isinstance(digest, str) and SHA256_DIGEST.fullmatch(digest)
    }


@dataclass(frozen=True)
class PinnedImages:
    """What each image reference runs as (`pinned`), the digests a stack that is not dev records
    (`digests`: tag reference -> digest) and the `repinImages` value they were resolved under."""

    pinned: Mapping[str, str]
    digests: Mapping[str, str] = field(default_factory=dict)
    repin: str | None = None
    # The tag references resolved at this preview (the others were kept or given by digest).
    resolved: tuple[str, ...] = ()

    def __getitem__(self, reference: str) -> str:
        return self.pinned[reference]

    @property
    def record(self) -> dict[str, Any]:
        """The stack output `images`, which a later preview keeps the digests from; empty on a dev stack."""
        if not self.digests:
            return {}
        return {"digests": dict(self.digests), **({REPIN_KEY: self.repin} if self.repin else {})}


def to_resolve(references: list[str], stack: str, kept: Mapping[str, str]) -> list[str]:
    """The references whose digest must be read from their registry: on a stack that is not dev,
    each tag without a digest given or kept."""
    if is_dev_stack(stack):
        return []
    return [reference for reference in references if "@" not in reference and reference not in kept]


def pinned_images(
    references: list[str], stack: str, kept: Mapping[str, str], read: Mapping[str, str], repin: str | None
) -> PinnedImages:
    """Each reference as it runs: a dev stack's as written; elsewhere a digest given as it is, a tag at
    its kept digest, else at the one `read` now."""
    if is_dev_stack(stack):
        return PinnedImages({reference: reference for reference in references})
    digests = {
        reference: kept.get(reference) or read[reference] for reference in references if "@" not in reference
    }
    return PinnedImages(
        pinned={
            reference: pinned_reference(reference, digests[reference]) if reference in digests else reference
            for reference in references
        },
        digests=digests,
        repin=repin,
        resolved=tuple(reference for reference in references if reference in read),
    )


# --- the registry's answers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Challenge:
    """One `WWW-Authenticate` challenge: its scheme (lower case) and auth-params (names lower case)."""

    scheme: str
    params: Mapping[str, str]


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf'\s*,?\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)')
_SCHEME = re.compile(rf"\s*,?\s*({_TOKEN})")


def parse_challenges(values: tuple[str, ...]) -> list[Challenge]:
    """The challenges of every `WWW-Authenticate` value (RFC 7235 section 4.1: `scheme` followed by
    comma-separated `name=value` or `name="quoted"` params; one header may hold several challenges)."""
    found: list[Challenge] = []
    for value in values:
        position, scheme, params = 0, "", {}
        while position < len(value.rstrip()):
            param = _PARAM.match(value, position)
            if param and scheme:
                raw = param.group(2)
                params[param.group(1).lower()] = (
                    re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
                )
                position = param.end()
                continue
            named = _SCHEME.match(value, position)
            if not named:
                break
            if scheme:
                found.append(Challenge(scheme, params))
            scheme, params, position = named.group(1).lower(), {}, named.end()
        if scheme:
            found.append(Challenge(scheme, params))
    return found


def token_url(challenge: Challenge, repository: str) -> str | None:
    """Where a Bearer challenge's token is asked for, with the pull scope of `repository` and the
    challenge's `service`; None when its realm is no http(s) URL."""
    realm = challenge.params.get("realm", "")
    if urlsplit(realm).scheme not in ("https", "http") or not urlsplit(realm).netloc:
        return None
    query = {"scope": f"repository:{repository}:pull"}
    if challenge.params.get("service"):
        query["service"] = challenge.params["service"]
    return f"{realm}{'&' if '?' in realm else '?'}{urlencode(query)}"


def token_of(body: bytes) -> str | None:
    """The bearer token of a token endpoint's answer: `token`, or `access_token` (the token
    authentication spec's OAuth 2.0 name for it)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    token = answer.get("token") or answer.get("access_token")
    return token if isinstance(token, str) and token else None


def error_codes(body: bytes) -> list[str]:
    """The `code`s of an error answer's JSON body (OCI distribution spec, "Error Codes"), if it has one."""
    try:
        answer = json.loads(body)
    except ValueError:
        return []
    errors = answer.get("errors") if isinstance(answer, dict) else None
    if not isinstance(errors, list):
        return []
    return [str(error["code"]) for error in errors if isinstance(error, dict) and "code" in error]


def media_type(content_type: str) -> str:
    """A `Content-Type` without its parameters, which clients SHOULD ignore (OCI distribution spec,
    "Pulling manifests")."""
    return content_type.split(";", 1)[0].strip().lower()


def head_digest(headers: Mapping[str, str]) -> str | None:
    """The digest a HEAD answer names, when it names a sha256 one."""
    digest = headers.get("docker-content-digest", "").strip()
    return digest if SHA256_DIGEST.fullmatch(digest) else None


def manifest_digest(headers: Mapping[str, str], body: bytes) -> str:
    """The digest of a manifest a GET answered with: the sha256 of its bytes, which a
    `Docker-Content-Digest` header, where present, must name (OCI distribution spec: a client that uses
    the header MUST verify it). Raises `RegistryProblem` for an answer that is no manifest or contradicts itself."""
    served = media_type(headers.get("content-type", ""))
    if served not in MANIFEST_TYPES:
        raise RegistryProblem(
            "not-a-manifest", f"it answered with {served or 'no content type'}, not a manifest"
        )
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    header = headers.get("docker-content-digest", "").strip()
    if header.startswith("sha256:") and header != digest:
        raise RegistryProblem(
            "not-a-manifest",
            f"its Docker-Content-Digest {header} is not the sha256 of the manifest it sent ({digest})",
        )
    return digest


def status_problem(status: int, body: bytes, authorized: bool) -> RegistryProblem:
    """What a manifest request's failing answer means."""
    codes = error_codes(body)
    shown = f"{status}{' ' + ', '.join(codes) if codes else ''}"
    if status == 404:
        return RegistryProblem("unknown", shown)
    if status in (401, 403):
        return RegistryProblem("denied", f"{shown}{'' if authorized else ', without credentials'}")
    if status == 429:
        return RegistryProblem("unreachable", f"{shown}: it limits this machine's requests")
    return RegistryProblem("unreachable" if status >= 500 else "failed", shown)


class RegistryProblem(Exception):
    """Why a registry gave no digest: `kind` is `unreachable`, `unknown` (no such tag or repository),
    `denied`, `credentials` (it wants credentials the preview has not), `not-a-manifest` or
    `failed`; `detail` what it answered."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def unpinned_message(where: str, reference: str, problem: RegistryProblem) -> str:
    """One line: which image, what its registry answered, and the fix."""
    image = parse_image_reference(reference)
    host, key = image.api_host, where == IMAGE_KEY
    fix_by_hand = f"or give its digest yourself (`pulumi config set image {reference}@sha256:<digest>`)"
    if problem.kind == "unknown":
        what = f"{host} has no tag {image.tag} in {image.repository} ({problem.detail})"
        fix = (
            "set image to a tag that repository has"
            if key
            else "the tag is pinned with the chart in workloads/manifests/charts.py (`image_tag`): correct it there"
        )
    elif problem.kind in ("denied", "credentials"):
        what = f"{host} refused to give this machine the manifest of {image.repository}:{image.tag} ({problem.detail})"
        fix = (
            f"use an image this machine may pull without credentials, {fix_by_hand}"
            if key
            else "allow the identity running Pulumi to pull it (for ECR: ecr:GetAuthorizationToken and ecr:BatchGetImage)"
        )
    else:
        what = f"the preview could not read the digest of tag {image.tag} from {host} ({problem.detail})"
        fix = f"run the preview again where https://{host} answers" + (f", {fix_by_hand}" if key else "")
    return (
        f"{where} = {reference!r}: {what}; a stack that is not dev runs each image by its digest, read from "
        f"the registry at the first deploy and kept: {fix}"
    )
