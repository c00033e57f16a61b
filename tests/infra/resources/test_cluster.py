"""The cluster's access entries: which caller counts as a listed principal; the add-on versions it keeps."""

from __future__ import annotations

import pytest

from infra.resources.cluster import kept_addon_version, names_same_principal


@pytest.mark.parametrize(
    "caller, principal, same",
    [
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/alice", True),
        (
            "arn:aws:sts::123456789012:assumed-role/ci-deployer/gh-run-7",
            "arn:aws:iam::123456789012:role/platform/ci-deployer",
            True,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ci-deployer/gh-run-7",
            "arn:aws:iam::210987654321:role/ci-deployer",
            False,
        ),
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:role/alice", False),
    ],
)
def test_the_caller_is_matched_to_a_listed_principal(caller, principal, same):
    assert names_same_principal(caller, principal) is same


NEWEST = "v1.12.4-eksbuild.4"


@pytest.mark.parametrize(
    ("live_version", "live_kubernetes_version", "wanted", "chosen"),
    [
        pytest.param(None, None, "1.34", NEWEST, id="no cluster yet"),
        pytest.param(None, "1.34", "1.34", NEWEST, id="a cluster without the add-on"),
        pytest.param(
            "v1.12.4-eksbuild.3", "1.34", "1.34", "v1.12.4-eksbuild.3", id="kept at the same version"
        ),
        pytest.param("v1.12.4-eksbuild.4", "1.34", "1.34", NEWEST, id="kept, already the newest"),
        pytest.param("v1.12.4-eksbuild.3", "1.34", "1.35", NEWEST, id="kubernetesVersion moves"),
    ],
)
def test_an_addon_keeps_the_live_version_until_kubernetes_version_moves(
    live_version, live_kubernetes_version, wanted, chosen
):
    assert kept_addon_version(live_version, live_kubernetes_version, wanted, NEWEST) == chosen
