"""Image digests read at preview (the judgements over them: `infra.aws_rules.image_pins`): each tag's
digest from its registry over standard-library HTTP, an ECR registry's credentials through the AWS
provider, and the digests the stack recorded through the engine.

How a digest is read, as a container runtime reads it before a pull (anonymously, but from ECR):

1. `HEAD /v2/<name>/manifests/<tag>` (OCI distribution spec v1.1.1, "Checking if content exists in
   the registry"), with an `Accept` header listing the OCI image index, the OCI image manifest,
   Docker's manifest list and Docker's v2 manifest ("Pulling manifests"; content-negotiation.md): a
   multi-platform tag then answers with its index, the digest every node resolves its own platform
   from, not one platform's manifest.
2. A `401`'s challenge is answered once. For a Bearer one the client GETs
   `<realm>?scope=repository:<name>:pull&service=<service>` with no credentials and asks again with
   `Authorization: Bearer <token>`. public.ecr.aws challenges `Bearer
   realm="https://public.ecr.aws/token/",service="public.ecr.aws",scope="aws"`, quay.io `Bearer
   realm="https://quay.io/v2/auth",service="quay.io"` (at times after a `Basic` challenge on the same
   line), nvcr.io `Bearer realm="https://nvcr.io/proxy_auth"`. A private ECR registry, where EKS
   keeps the EFA device plugin's image in each region, challenges `Basic
   realm="https://<host>/",service="ecr.amazonaws.com"`: its password is an ECR authorization token
   (`ecr:GetAuthorizationToken` through the AWS provider, with the stack's own provider settings),
   good for every registry the identity may pull from, EKS's included (its repositories let every
   account pull, `ecr:BatchGetImage`).
3. Where the HEAD answer names no digest (ECR has left `Docker-Content-Digest` out of GET answers,
   aws/containers-roadmap#1931; ChangemakerStudios/Docker.Registry.DotNet#34 reports it named on
   HEAD, not on GET), the manifest is fetched with GET and hashed.

A redirect (registry.k8s.io sends each request on to a regional Artifact Registry) is followed here,
not by urllib, so a token goes to the host whose challenge asked for it and to no other.

A later preview of a stack whose cluster runs reads its recorded digests back from the stack output
`images` through the engine's builtin invoke `pulumi:pulumi:readStackOutputs` (what a StackReference
reads).

Outside a test a registry's address comes from the image reference alone (`https://<host>`):
`Registry.endpoint` is the seam the tests point at their fake registries
(tests/harness/fake_oci_registry.py), passing a `Registry` of their own, or, for the whole program,
putting one in `REGISTRY`, the one `pin_images` uses when given none.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import pulumi
import pulumi_aws as aws

from infra.aws_rules.image_pins import (
    ECR_HOST,
    MANIFEST_MAX_BYTES,
    MANIFEST_TYPES,
    RECORD_OUTPUT,
    REPIN_KEY,
    PinnedImages,
    RegistryProblem,
    head_digest,
    manifest_digest,
    parse_challenges,
    pinned_images,
    recorded_digests,
    status_problem,
    to_resolve,
    token_of,
    token_url,
    unpinned_message,
)
from infra.config.key_parsers import ImageReference, parse_image_reference

REDIRECTS_MAX = 5
REQUEST_TIMEOUT_S = 10.0


# --- the registries --------------------------------------------------------------------------------


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


class UnpinnedImage(pulumi.RunError):
    """An image the preview could not pin by digest; one line naming where it is set and the fix.
    `pulumi.RunError` makes the Pulumi CLI print it without a traceback."""


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
