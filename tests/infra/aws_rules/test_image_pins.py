"""Image digests (`infra.aws_rules.image_pins`): references, challenges and answers judged by pure
functions, and what a stack keeps from its record. (The reads: tests/infra/preflight/reads/test_image_digests.py.)"""

from __future__ import annotations

import pytest

from infra.aws_rules.image_pins import (
    IMAGE_KEY,
    Challenge,
    PinnedImages,
    RegistryProblem,
    head_digest,
    manifest_digest,
    parse_challenges,
    pinned_images,
    pinned_reference,
    recorded_digests,
    to_resolve,
    token_of,
    token_url,
    unpinned_message,
)
from infra.config.key_parsers import parse_image_reference
from tests.harness.fake_oci_registry import digest_of

RAY = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
KUBERAY = "quay.io/kuberay/operator:v1.7.0"
NVIDIA = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
EFA = "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20"
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


# --- references ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, host, repository, tag, digest",
    [
        (RAY, "public.ecr.aws", "deep-learning-containers/ray", "train-ml-cuda-v1.1", None),
        (
            EFA,
            "602401143452.dkr.ecr.us-east-2.amazonaws.com",
            "eks/aws-efa-k8s-device-plugin",
            "v0.5.20",
            None,
        ),
        ("rayproject/ray:2.58.0-py311-gpu", "docker.io", "rayproject/ray", "2.58.0-py311-gpu", None),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("localhost:5000/team/ray:1@" + DIGEST, "localhost:5000", "team/ray", "1", DIGEST),
        ("registry.example.com/ray@" + DIGEST, "registry.example.com", "ray", None, DIGEST),
    ],
)
def test_a_reference_is_taken_apart_as_docker_reads_it(reference, host, repository, tag, digest):
    image = parse_image_reference(reference)
    assert (image.host, image.repository, image.tag, image.digest) == (host, repository, tag, digest)


def test_docker_hub_answers_at_its_api_host_and_a_pin_keeps_the_tag():
    assert parse_image_reference("rayproject/ray:2.58.0").api_host == "registry-1.docker.io"
    assert parse_image_reference(RAY).api_host == "public.ecr.aws"
    assert pinned_reference(RAY, DIGEST) == f"{RAY}@{DIGEST}"
    assert pinned_reference(f"{RAY}@{OTHER}", DIGEST) == f"{RAY}@{DIGEST}"


# --- challenges and answers ------------------------------------------------------------------------


def test_challenges_are_read_as_each_registry_words_them():
    public_ecr = 'Bearer realm="https://public.ecr.aws/token/",service="public.ecr.aws",scope="aws"'
    assert parse_challenges((public_ecr,)) == [
        Challenge(
            "bearer", {"realm": "https://public.ecr.aws/token/", "service": "public.ecr.aws", "scope": "aws"}
        )
    ]
    # quay.io has sent a Basic and a Bearer challenge on one line.
    quay = 'Basic realm="quay.io", Bearer realm="https://quay.io/v2/auth",service="quay.io"'
    assert parse_challenges((quay,)) == [
        Challenge("basic", {"realm": "quay.io"}),
        Challenge("bearer", {"realm": "https://quay.io/v2/auth", "service": "quay.io"}),
    ]
    ecr = 'Basic realm="https://602401143452.dkr.ecr.us-east-2.amazonaws.com/",service="ecr.amazonaws.com"'
    assert parse_challenges((ecr,))[0].scheme == "basic"
    # Unquoted values, odd spacing and case, an escaped quote, and two headers.
    odd = parse_challenges(('  bearer REALM="https://a.test/t" , Service=a.test , x="say \\"hi\\""', "Basic"))
    assert odd == [
        Challenge("bearer", {"realm": "https://a.test/t", "service": "a.test", "x": 'say "hi"'}),
        Challenge("basic", {}),
    ]


def test_the_token_is_asked_for_the_repositorys_pull_scope_at_the_realm():
    challenge = Challenge(
        "bearer", {"realm": "https://public.ecr.aws/token/", "service": "public.ecr.aws", "scope": "aws"}
    )
    assert token_url(challenge, "deep-learning-containers/ray") == (
        "https://public.ecr.aws/token/?scope=repository%3Adeep-learning-containers%2Fray%3Apull&service=public.ecr.aws"
    )
    assert token_url(Challenge("bearer", {"realm": "https://nvcr.io/proxy_auth?x=1"}), "a") == (
        "https://nvcr.io/proxy_auth?x=1&scope=repository%3Aa%3Apull"
    )
    assert token_url(Challenge("bearer", {"realm": "file:///etc/passwd"}), "a") is None
    assert token_url(Challenge("bearer", {}), "a") is None
    assert token_of(b'{"token": "t", "expires_in": 60}') == "t"
    assert token_of(b'{"access_token": "a"}') == "a"
    assert token_of(b'{"token": ""}') is None and token_of(b"<html>") is None and token_of(b"[]") is None


def test_a_digest_is_the_header_on_head_and_the_hash_of_the_bytes_on_get():
    manifest = b'{"schemaVersion": 2}'
    assert head_digest({"docker-content-digest": DIGEST}) == DIGEST
    assert head_digest({"docker-content-digest": "sha512:abc"}) is None and head_digest({}) is None
    served = {"content-type": "application/vnd.oci.image.index.v1+json; charset=utf-8"}
    assert manifest_digest(served, manifest) == digest_of(manifest)
    assert manifest_digest({**served, "docker-content-digest": digest_of(manifest)}, manifest) == digest_of(
        manifest
    )
    with pytest.raises(RegistryProblem, match="is not the sha256 of the manifest"):
        manifest_digest({**served, "docker-content-digest": DIGEST}, manifest)
    with pytest.raises(RegistryProblem, match="answered with text/html, not a manifest"):
        manifest_digest({"content-type": "text/html"}, b"<html>")


def test_the_messages_name_where_the_image_is_set_and_the_fix_in_one_line():
    unknown = unpinned_message(IMAGE_KEY, RAY, RegistryProblem("unknown", "404 MANIFEST_UNKNOWN"))
    assert unknown.startswith(
        f"config key 'image' = {RAY!r}: public.ecr.aws has no tag train-ml-cuda-v1.1 in "
    )
    assert "set image to a tag that repository has" in unknown and "\n" not in unknown
    down = unpinned_message(IMAGE_KEY, RAY, RegistryProblem("unreachable", "ConnectionRefusedError"))
    assert "run the preview again where https://public.ecr.aws answers" in down
    assert f"`pulumi config set image {RAY}@sha256:<digest>`" in down
    chart = "the image of chart kuberay-operator 1.7.0 (workloads/manifests/charts.py)"
    lacking = unpinned_message(chart, KUBERAY, RegistryProblem("unknown", "404"))
    assert (
        lacking.startswith(f"{chart} = {KUBERAY!r}: quay.io has no tag v1.7.0") and "`image_tag`" in lacking
    )
    denied = unpinned_message(chart, EFA, RegistryProblem("credentials", "no ECR authorization token"))
    assert "ecr:GetAuthorizationToken and ecr:BatchGetImage" in denied


# --- what is kept ----------------------------------------------------------------------------------


def test_a_recorded_digest_is_kept_until_repin_images_names_another_value():
    record = {"digests": {RAY: DIGEST, KUBERAY: "md5:x", 3: DIGEST}, "repinImages": "2026-12-01"}
    assert recorded_digests(record, None) == {RAY: DIGEST}
    assert recorded_digests(record, "2026-12-01") == {RAY: DIGEST}
    assert recorded_digests(record, "2026-12-06") == {}
    assert recorded_digests({"digests": {RAY: DIGEST}}, "2026-12-06") == {}
    assert recorded_digests(None, None) == {} and recorded_digests({"digests": [RAY]}, None) == {}


def test_only_tags_outside_dev_are_resolved_and_a_given_digest_runs_as_it_is():
    given = f"{NVIDIA}@{OTHER}"
    references = [RAY, given, KUBERAY]
    assert to_resolve(references, "dev-alice", {}) == []
    assert to_resolve(references, "prod", {RAY: DIGEST}) == [KUBERAY]
    pins = pinned_images(references, "prod", {RAY: DIGEST}, {KUBERAY: OTHER}, "r1")
    assert pins[RAY] == f"{RAY}@{DIGEST}" and pins[given] == given and pins[KUBERAY] == f"{KUBERAY}@{OTHER}"
    assert pins.record == {"digests": {RAY: DIGEST, KUBERAY: OTHER}, "repinImages": "r1"}
    assert pins.resolved == (KUBERAY,)
    dev = pinned_images(references, "dev", {}, {}, None)
    assert dev.pinned == {reference: reference for reference in references} and dev.record == {}
    assert PinnedImages({}).record == {}
