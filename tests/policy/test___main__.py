"""The pack's entry point (`policy/__main__.py`, run as Pulumi runs the pack: the directory as a
script): it lists every registered rule with its enforcement."""

from __future__ import annotations

import runpy
import sys

import pulumi_policy
from pulumi_policy import EnforcementLevel

from policy.rules import registered
from tests.harness.paths import REPO_ROOT

POLICY_DIR = REPO_ROOT / "policy"
DEFINED_RULES = registered()


def test_entry_point_lists_every_rule_with_its_enforcement(monkeypatch):
    packs = []

    def record_pack(name, policies, **_):
        packs.append((name, policies))

    monkeypatch.setattr(pulumi_policy, "PolicyPack", record_pack)

    def pack_modules() -> set[str]:
        return {name for name in sys.modules if name == "rules" or name.startswith("rules.")}

    had = pack_modules()
    try:
        runpy.run_path(str(POLICY_DIR), run_name="__main__")  # as Pulumi runs the pack: the directory
    finally:
        for name in pack_modules() - had:
            sys.modules.pop(name)
    [(name, policies)] = packs
    assert name == "eks-ray-train"
    listed = {policy.name: policy.enforcement_level for policy in policies}
    assert listed == {rule.name: rule.enforcement for rule in DEFINED_RULES}
    assert len(listed) == len(policies)
    assert {rule.name for rule in DEFINED_RULES if rule.enforcement is EnforcementLevel.ADVISORY} == {
        "eks-control-plane-logging",
        "eks-deletion-protection",
        "log-groups-kms-encrypted",
    }
