"""Which CloudWatch Observability add-on versions give the dashboard what it graphs."""

from __future__ import annotations

import pytest

from infra.aws_rules import container_insights


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("v6.4.0-eksbuild.1", None),
        ("v5.3.0-eksbuild.1", None),
        ("v6.2.0-eksbuild.2", None),
        ("v4.10.3-eksbuild.1", "predates v5.3.0"),
        ("v6.1.0-eksbuild.1", "turns OTel Container Insights on by default"),
        ("6.4.0", "is not a version EKS names"),
    ],
)
def test_the_add_on_version_must_give_the_dashboard_its_metrics(version, problem):
    found = container_insights.addon_version_problem(version)
    assert (found is None) if problem is None else (problem in (found or ""))
