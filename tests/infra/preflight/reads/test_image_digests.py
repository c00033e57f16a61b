"""Image digests read at preview (`infra.preflight.reads.image_digests`): the fetch layer against
registries that speak the OCI distribution API as public.ecr.aws, quay.io, nvcr.io, a private ECR
registry and registry.k8s.io do (tests/harness/fake_oci_registry.py); the stack's record read through
the engine, and ECR's token through the AWS provider."""

from __future__ import annotations

import time

import pytest

from infra.aws_rules.image_pins import IMAGE_KEY, MANIFEST_TYPES, RegistryProblem
from infra.preflight.reads.image_digests import Registry, UnpinnedImage, ecr_authorization, pin_images
from tests.harness.fake_oci_registry import FakeRegistries
from tests.harness.loopback import SilentEndpoint

RAY = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
KUBERAY = "quay.io/kuberay/operator:v1.7.0"
NVIDIA = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
EFA = "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20"
DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def registries():
    fakes = FakeRegistries()
    yield fakes
    fakes.stop()


# --- the fetch layer against the fake registries ---------------------------------------------------


def test_public_ecr_the_token_challenge_then_head_with_the_digest_header(registries):
    digest = registries.push(RAY)
    assert registries.registry().digest(RAY) == digest
    host = registries.hosts["public.ecr.aws"]
    first, token, second = host.requests
    assert (first.method, first.authorization) == ("HEAD", None)
    assert token.path == (
        "/token/?scope=repository%3Adeep-learning-containers%2Fray%3Apull&service=public.ecr.aws"
    )
    assert (second.method, second.authorization) == (
        "HEAD",
        "Bearer public-ecr-token-for-deep-learning-containers/ray",
    )
    assert second.accept == ", ".join(MANIFEST_TYPES)


def test_quay_and_nvcr_answer_the_same_way_whatever_their_challenges_look_like(registries):
    quay, nvcr = registries.push(KUBERAY), registries.push(NVIDIA)
    assert registries.registry().digest(KUBERAY) == quay
    assert registries.registry().digest(NVIDIA) == nvcr
    assert [
        r.path.split("?")[0] for r in registries.hosts["nvcr.io"].requests if "manifests" not in r.path
    ] == ["/proxy_auth"]


def test_a_private_ecr_registry_takes_its_token_and_names_the_digest_on_head_only(registries):
    digest = registries.push(EFA)
    host = registries.hosts["602401143452.dkr.ecr.us-east-2.amazonaws.com"]
    assert registries.registry().digest(EFA) == digest
    assert [(r.method, r.authorization is not None) for r in host.requests] == [
        ("HEAD", False),
        ("HEAD", True),
    ]
    # Without ECR's credentials the preview can only say so.
    anonymous = Registry(endpoint=registries.endpoint, credentials=lambda host: None, timeout_s=2.0)
    with pytest.raises(RegistryProblem, match="credentials: 401 Basic"):
        anonymous.digest(EFA)


def test_without_a_digest_on_head_the_manifest_is_fetched_and_hashed(registries):
    digest = registries.push(RAY)
    registries.hosts["public.ecr.aws"].digest_on_head = False
    registries.hosts["public.ecr.aws"].digest_on_get = False
    assert registries.registry().digest(RAY) == digest
    methods = [r.method for r in registries.hosts["public.ecr.aws"].manifest_requests()]
    assert methods == ["HEAD", "HEAD", "GET"]  # the token is reused for the GET


def test_a_redirect_is_followed_and_the_token_goes_only_to_the_host_that_asked(registries):
    """registry.k8s.io sends a pull on to a regional Artifact Registry, which challenges for itself."""
    reference = "registry.k8s.io/nfd/node-feature-discovery:v0.18.0"
    backend = registries.host("us-west1-docker.pkg.dev")
    backend.flavour = "nvcr"  # a Bearer challenge of its own
    digest = backend.push("nfd/node-feature-discovery", "v0.18.0")
    registries.host("registry.k8s.io", redirect_to=backend)
    assert registries.registry().digest(reference) == digest
    front = registries.hosts["registry.k8s.io"].requests
    assert [r.authorization for r in front] == [None]  # only the first request reached it
    assert [r.authorization is not None for r in backend.manifest_requests()] == [False, True]


def test_an_unknown_tag_and_an_unknown_repository_are_404s(registries):
    registries.push(RAY)
    with pytest.raises(RegistryProblem) as raised:
        registries.registry().digest(RAY.replace("v1.1", "v9.9"))
    assert (raised.value.kind, raised.value.detail) == ("unknown", "404")  # HEAD has no body
    with pytest.raises(RegistryProblem, match="unknown"):
        registries.registry().digest("public.ecr.aws/nobody/nothing:1")


def test_an_unreachable_host_and_a_silent_one_are_unreachable(registries):
    with pytest.raises(RegistryProblem) as refused:
        registries.registry().digest(RAY)
    assert refused.value.kind == "unreachable" and "ConnectionRefused" in refused.value.detail
    silent = SilentEndpoint()
    try:
        registries.unreachable = silent.endpoint
        started = time.monotonic()
        with pytest.raises(RegistryProblem, match="unreachable"):
            registries.registry(timeout_s=0.3).digest(RAY)
        assert time.monotonic() - started < 2
    finally:
        silent.stop()


def test_a_token_for_another_repository_is_denied(registries):
    registries.push(RAY)
    host = registries.hosts["public.ecr.aws"]
    host._admits = lambda authorization, name: False  # a private repository: no token opens it
    with pytest.raises(RegistryProblem) as raised:
        registries.registry().digest(RAY)
    assert (raised.value.kind, raised.value.detail) == ("denied", "401")


# --- the preview -----------------------------------------------------------------------------------


def test_a_dev_stack_and_pinned_images_ask_nothing_of_anyone(registries, monkeypatch):
    monkeypatch.setattr(
        "infra.preflight.reads.image_digests.read_record", lambda: pytest.fail("no record is read")
    )
    pins = pin_images({IMAGE_KEY: RAY}, "dev", None, live=True, registry=registries.registry())
    assert pins[RAY] == RAY
    given = f"{RAY}@{DIGEST}"
    assert (
        pin_images({IMAGE_KEY: given}, "prod", None, live=True, registry=registries.registry())[given]
        == given
    )
    assert registries.hosts == {}


def test_a_failure_is_one_line_naming_the_key(registries, monkeypatch):
    monkeypatch.setattr("infra.preflight.reads.image_digests.read_record", lambda: None)
    with pytest.raises(UnpinnedImage) as raised:
        pin_images({IMAGE_KEY: RAY}, "prod", None, live=False, registry=registries.registry())
    message = str(raised.value)
    assert (
        message.startswith(f"config key 'image' = {RAY!r}: the preview could not read the digest")
        and "\n" not in message
    )


def test_an_unreadable_record_stops_the_preview_rather_than_move_a_live_stacks_images(monkeypatch):
    def refused(token, args, *rest, **kwargs):
        assert token == "pulumi:pulumi:readStackOutputs"
        raise RuntimeError("backend: 503 Service Unavailable\nmore")

    monkeypatch.setattr("pulumi.runtime.invoke", refused)
    with pytest.raises(UnpinnedImage) as raised:
        pin_images({IMAGE_KEY: RAY}, "prod", None, live=True)
    message = str(raised.value)
    assert message.startswith(
        "could not read this stack's outputs (pulumi:pulumi:readStackOutputs: backend: 503"
    )
    assert "run the preview again once the Pulumi backend answers" in message and "\n" not in message


def test_only_an_ecr_host_gets_an_ecr_token_and_a_refused_one_says_which_permission(monkeypatch):
    asked: list[str | None] = []

    def token(region=None, **kwargs):
        asked.append(region)
        raise RuntimeError("AccessDeniedException: not authorized to perform ecr:GetAuthorizationToken")

    monkeypatch.setattr("pulumi_aws.ecr.get_authorization_token", token)
    assert ecr_authorization("public.ecr.aws") is None and ecr_authorization("quay.io") is None
    with pytest.raises(RegistryProblem) as raised:
        ecr_authorization("602401143452.dkr.ecr.us-east-2.amazonaws.com")
    assert (
        raised.value.kind == "credentials"
        and "ecr:GetAuthorizationToken: AccessDenied" in raised.value.detail
    )
    assert asked == ["us-east-2"]
