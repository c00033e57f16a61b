"""The cluster's access entries: which caller counts as a listed principal."""

from __future__ import annotations

import pytest

from infra.resources.cluster import names_same_principal


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
