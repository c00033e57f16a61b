"""The Kubernetes version against the versions EKS offers: refused, warned in extended support,\nskipped when EKS does not answer."""

from __future__ import annotations

import pulumi

from infra.config.stack import ConfigError
from infra.preflight.kubernetes_version import kubernetes_version_problem
from tests.harness.fake_aws import EKS_VERSIONS, FakeAws
from tests.harness.preflight_run import place, refusal


def test_a_kubernetes_version_eks_does_not_offer_is_refused_with_the_offered_ones():
    message = refusal(FakeAws(), ConfigError, kubernetesVersion="1.29")
    assert message == (
        "config key 'kubernetesVersion' = '1.29': EKS offers "
        f"{', '.join(sorted(EKS_VERSIONS, key=lambda v: tuple(map(int, v.split('.')))))} here: pick one of them"
    )


def test_a_version_in_extended_support_is_planned_with_a_warning(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    place(FakeAws(), kubernetesVersion="1.33")
    assert any("1.33 is in EKS extended support" in warning for warning in warnings)


def test_the_version_check_is_skipped_with_a_warning_when_eks_refuses_to_answer(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    place(FakeAws(denied={"aws:eks/getClusterVersions:getClusterVersions"}))
    assert any(warning.startswith("kubernetesVersion 1.36 was not checked") for warning in warnings)


def test_kubernetes_version_judgement():
    offered = {"1.36": "STANDARD_SUPPORT", "1.33": "EXTENDED_SUPPORT", "1.28": "UNSUPPORTED"}
    assert kubernetes_version_problem("1.36", offered) is None
    assert kubernetes_version_problem("1.33", offered) is None
    assert kubernetes_version_problem("1.28", offered) == "EKS offers 1.33, 1.36 here: pick one of them"
    assert kubernetes_version_problem("1.40", offered) == "EKS offers 1.33, 1.36 here: pick one of them"
