"""Images by digest outside dev stacks: each image tag resolved to its manifest's digest through the
registry's own API at the first deploy's preview, then kept on later `pulumi up`s (issue 60).

A tag can be moved by its publisher to other bits, so a node replaced later could pull other bits
than the rest run; a digest cannot. Every stack but a dev one (`dev`, `dev-*`, `*-dev`) therefore
runs the Ray image and the three charts' images (NVIDIA and EFA device plugins, KubeRay operator)
as `<repository>:<tag>@sha256:<digest>`; a dev stack runs the tags.

How a digest is read, as a container runtime reads it before a pull (anonymously, but from ECR):

1. `HEAD /v2/<name>/manifests/<tag>` (OCI distribution spec v1.1.1, "Checking if content exists in
   the registry"), with an `Accept` header listing the OCI image index, the OCI image manifest,
   Docker's manifest list and Docker's v2 manifest ("Pulling manifests"; content-negotiation.md): a
   multi-platform tag then answers with its index, the digest every node resolves its own platform
   from, not one platform's manifest.
2. A `401` carries `WWW-Authenticate` challenges (RFC 7235 section 4.1; several may share one
   header). For `Bearer realm=...,service=...` (Distribution's token authentication spec,
   distribution/distribution docs/content/spec/auth/token.md) the client GETs
   `<realm>?scope=repository:<name>:pull&service=<service>` with no credentials, takes `token` (or
   `access_token`) from the JSON answer and asks again with `Authorization: Bearer <token>`.
   public.ecr.aws challenges `Bearer realm="https://public.ecr.aws/token/",service="public.ecr.aws",
   scope="aws"`, quay.io `Bearer realm="https://quay.io/v2/auth",service="quay.io"` (at times after a
   `Basic` challenge on the same line), nvcr.io `Bearer realm="https://nvcr.io/proxy_auth"`. A private
   ECR registry, where EKS keeps the EFA device plugin's image in each region, challenges `Basic
   realm="https://<host>/",service="ecr.amazonaws.com"`: its password is an ECR authorization token
   (`ecr:GetAuthorizationToken` through the AWS provider, with the stack's own provider settings),
   good for every registry the identity may pull from, EKS's included (its repositories let every
   account pull, `ecr:BatchGetImage`).
3. The digest is the `Docker-Content-Digest` header, which a successful answer SHOULD carry (the OCI
   distribution spec, in both sections above); ECR has left it out of GET answers
   (aws/containers-roadmap#1931), so where the HEAD answer lacks it the manifest is fetched with GET
   and its digest is the sha256 of the bytes, checked against any header the GET answer carries
   (ChangemakerStudios/Docker.Registry.DotNet#34 reports ECR naming it on HEAD, not on GET).

A redirect (registry.k8s.io sends each request on to a regional Artifact Registry) is followed here,
not by urllib, so a token goes to the host whose challenge asked for it and to no other.

Kept: the digests are recorded in the stack output `images` (`PinnedImages.record`). A later
preview of a stack whose cluster runs reads that output back (the engine's builtin invoke
`pulumi:pulumi:readStackOutputs`, what a StackReference reads) and keeps each digest while the
reference that named it stands, as CoreDNS keeps its live version while `kubernetesVersion` stands
(`infra.resources.cluster.kept_addon_version`): a tag its publisher moved changes nothing until
asked. Asking is setting `image` to another tag or to a digest of your choosing, a chart bump (its
image tag changes), or `repinImages`, a value other than the recorded one, which resolves every tag
anew at the next preview.

The judgements (references, challenges, answers, what is kept, the messages) are pure functions; the
fetch layer is `Registry`, standard-library HTTP. Outside a test a registry's address comes from the
image reference alone (`https://<host>`): `Registry.endpoint` is the seam the tests point at their
fake registries (tests/harness/fake_oci_registry.py), passing a `Registry` of their own, or, for the
whole program, putting one in `REGISTRY`, the one `pin_images` uses when given none.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import pulumi
import pulumi_aws as aws

from infra.config.key_parsers import ImageReference, parse_image_reference
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
REDIRECTS_MAX = 5
REQUEST_TIMEOUT_S = 10.0


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


class UnpinnedImage(pulumi.RunError):
    """An image the preview could not pin by digest; one line naming where it is set and the fix.
    `pulumi.RunError` makes the Pulumi CLI print it without a traceback."""


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


# --- the fetch layer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, headers (names lower case; repeated ones joined), every
    `WWW-Authenticate` value, body, and the URL that gave it."""

    status: int
    headers: Mapping[str, str]
    challenges: tuple[str, ...]
    body: bytes
    url: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Hands a redirect back as an answer (`Registry._follow` follows it), so no header travels on."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def send(method: str, url: str, headers: Mapping[str, str], timeout_s: float) -> Answer:
    """One request, its answer whatever the status; `RegistryProblem("unreachable")` when no answer
    came (no such host, refused, timed out, TLS failed)."""
    request = urllib.request.Request(url, method=method, headers={"User-Agent": "eks-ray-train", **headers})
    try:
        response = _OPENER.open(request, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        response = err  # a 3xx, 4xx or 5xx: an answer all the same
    except (OSError, ValueError) as err:  # URLError, timeouts and TLS errors are OSErrors
        reason = getattr(err, "reason", err)
        raise RegistryProblem("unreachable", f"{type(reason).__name__}: {reason}") from None
    try:
        body = response.read(MANIFEST_MAX_BYTES + 1) if response.fp is not None else b""
    except OSError as err:
        raise RegistryProblem("unreachable", f"{type(err).__name__}: {err}") from None
    finally:
        response.close()
    message = response.headers
    return Answer(
        status=response.status,
        headers={name.lower(): ", ".join(message.get_all(name) or []) for name in set(message.keys())},
        challenges=tuple(message.get_all("WWW-Authenticate") or []),
        body=body,
        url=url,
    )


def https(host: str) -> str:
    """A registry's address: the host its image references name, over HTTPS."""
    return f"https://{host}"


def ecr_authorization(host: str) -> str | None:
    """`Basic <token>` for a private ECR registry (an ECR authorization token, read through the AWS
    provider with the stack's settings); None for any other host."""
    region = ECR_HOST.fullmatch(host)
    if not region:
        return None
    try:
        token = aws.ecr.get_authorization_token(region=region.group(1))
    except Exception as err:
        first = " ".join(str(err).strip().splitlines()[:1]) or type(err).__name__
        raise RegistryProblem(
            "credentials", f"no ECR authorization token (ecr:GetAuthorizationToken: {first})"
        ) from None
    return f"Basic {token.authorization_token}"


@dataclass(frozen=True)
class Registry:
    """How the preview reaches registries: `endpoint` gives a host's address (`https://<host>`;
    tests give their fake's), `credentials` the `Authorization` value a `Basic` challenge of a host
    is answered with (an ECR token for ECR's hosts; None: none), `timeout_s` each request's limit."""

    endpoint: Callable[[str], str] = https
    credentials: Callable[[str], str | None] = ecr_authorization
    timeout_s: float = REQUEST_TIMEOUT_S

    def digest(self, reference: str) -> str:
        """The digest `reference`'s tag names now; raises `RegistryProblem`."""
        image = parse_image_reference(reference)
        if image.tag is None:
            raise RegistryProblem("failed", "the reference names no tag")
        url = f"{self.endpoint(image.api_host)}/v2/{image.repository}/manifests/{image.tag}"
        head, authorization = self._manifest("HEAD", url, image, None)
        if head.status == 200 and (digest := head_digest(head.headers)):
            return digest
        if head.status not in (200, 405):
            raise status_problem(head.status, head.body, authorization is not None)
        # No digest on HEAD (or no HEAD at all): the manifest itself, hashed.
        get, authorization = self._manifest(
            "GET", head.url if head.status == 200 else url, image, authorization
        )
        if get.status != 200:
            raise status_problem(get.status, get.body, authorization is not None)
        if len(get.body) > MANIFEST_MAX_BYTES:
            raise RegistryProblem("not-a-manifest", f"its answer is over {MANIFEST_MAX_BYTES} bytes")
        return manifest_digest(get.headers, get.body)

    def _manifest(
        self, method: str, url: str, image: ImageReference, authorization: str | None
    ) -> tuple[Answer, str | None]:
        """The manifest request, answering a 401's challenge once."""
        answer = self._follow(method, url, authorization)
        if answer.status == 401 and authorization is None:
            authorization = self._authorization(answer, image)
            answer = self._follow(method, answer.url, authorization)
        return answer, authorization

    def _follow(self, method: str, url: str, authorization: str | None) -> Answer:
        """`send`, following redirects; `Authorization` goes only to the host it was made for."""
        accept = {"Accept": ", ".join(MANIFEST_TYPES)}
        host = urlsplit(url).netloc
        for _ in range(REDIRECTS_MAX + 1):
            sent = {
                **accept,
                **(
                    {"Authorization": authorization} if authorization and urlsplit(url).netloc == host else {}
                ),
            }
            answer = send(method, url, sent, self.timeout_s)
            location = answer.headers.get("location")
            if answer.status not in (301, 302, 303, 307, 308) or not location:
                return answer
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("https", "http"):
                raise RegistryProblem("failed", f"it redirected to {url}")
        raise RegistryProblem("failed", f"more than {REDIRECTS_MAX} redirects")

    def _authorization(self, answer: Answer, image: ImageReference) -> str:
        """The `Authorization` value that answers a 401: a Bearer token fetched anonymously from the
        challenge's realm, or `credentials` for a Basic challenge."""
        challenges = parse_challenges(answer.challenges)
        bearer = next((challenge for challenge in challenges if challenge.scheme == "bearer"), None)
        if bearer is not None:
            where = token_url(bearer, image.repository)
            if where is None:
                raise RegistryProblem("failed", f"its Bearer challenge names no token URL ({bearer.params})")
            token_answer = send("GET", where, {}, self.timeout_s)
            if token_answer.status != 200:
                raise status_problem(token_answer.status, token_answer.body, False)
            token = token_of(token_answer.body)
            if token is None:
                raise RegistryProblem("failed", f"its token endpoint {where.split('?')[0]} gave no token")
            return f"Bearer {token}"
        if any(challenge.scheme == "basic" for challenge in challenges):
            # Credentials go to the image's own registry, never to a host it redirected to.
            own = answer.url.startswith(f"{self.endpoint(image.api_host)}/")
            credentials = self.credentials(image.api_host) if own else None
            if credentials is None:
                raise RegistryProblem("credentials", "401 Basic: it admits only users with credentials")
            return credentials
        raise RegistryProblem(
            "denied", f"401 with no challenge the preview answers ({', '.join(answer.challenges) or 'none'})"
        )


# The registries every program run reaches; tests point it at their fake.
REGISTRY = Registry()


# --- the preview -----------------------------------------------------------------------------------


def _this_stack() -> str:
    """This stack's fully qualified name, `<organization>/<project>/<stack>` (the bare stack name where
    the engine names no organization)."""
    organization = pulumi.get_organization()
    return (
        f"{organization}/{pulumi.get_project()}/{pulumi.get_stack()}" if organization else pulumi.get_stack()
    )


def read_record() -> Any:
    """The stack output `images` as the last `pulumi up` recorded it (None: none), read through the
    engine's builtin `pulumi:pulumi:readStackOutputs`."""
    try:
        answer = pulumi.runtime.invoke("pulumi:pulumi:readStackOutputs", {"name": _this_stack()})
    except Exception as err:
        first = " ".join(str(err).strip().splitlines()[:1]) or type(err).__name__
        raise UnpinnedImage(
            f"could not read this stack's outputs (pulumi:pulumi:readStackOutputs: {first}), whose `{RECORD_OUTPUT}` "
            "holds the digests its images run by; resolved anew they could move a live stack's images: run the "
            "preview again once the Pulumi backend answers"
        ) from None
    outputs = (answer.value or {}).get("outputs") or {}
    return outputs.get(RECORD_OUTPUT) if isinstance(outputs, Mapping) else None


def pin_images(
    images: Mapping[str, str], stack: str, repin: str | None, live: bool, registry: Registry | None = None
) -> PinnedImages:
    """Each image (`images`: where it is set -> its reference) as the stack runs it: by digest outside
    dev, kept from the stack's record while its cluster runs (`live`), else read from its registry
    now and named in one line. Raises `UnpinnedImage` naming where the image is set and the fix."""
    references = list(dict.fromkeys(images.values()))
    needed = to_resolve(references, stack, {})
    kept = recorded_digests(read_record(), repin) if needed and live else {}
    where = {reference: place for place, reference in images.items()}
    read: dict[str, str] = {}
    for reference in to_resolve(references, stack, kept):
        try:
            read[reference] = (registry or REGISTRY).digest(reference)
        except RegistryProblem as problem:
            raise UnpinnedImage(unpinned_message(where[reference], reference, problem)) from None
        pulumi.log.info(
            f"{where[reference]} = {reference!r}: pinned to {read[reference]}, read from "
            f"{parse_image_reference(reference).api_host} at this preview; later `pulumi up`s keep it "
            f"(`pulumi config set {REPIN_KEY} <date>` reads every tag anew)"
        )
    return pinned_images(references, stack, kept, read, repin)
