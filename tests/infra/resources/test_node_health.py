"""The EKS node monitoring agent add-on and the GPU group's node auto repair in the program's plan."""

from __future__ import annotations

import json

from infra.aws_rules.node_repair import ADDON_NAME as NMA
from tests.harness.fake_aws import NODE_MONITORING_VERSIONS, FakeAws
from tests.harness.preview_queries import NODE_GROUP
from tests.harness.program import dev_config, run_program

# --- node auto repair (`gpuNodeAutoRepair`) -------------------------------------------------------


def node_monitoring_addons(plan) -> list:
    return [addon for addon in plan.of_type("aws:eks/addon:Addon") if addon.inputs["addonName"] == NMA]


def test_the_gpu_group_repairs_its_nodes_with_the_monitoring_agent_by_default(stack_plan):
    """EKS node auto repair acts on the node conditions the node monitoring agent sets (EKS user
    guide, "Automatically repair nodes in EKS clusters"): both are on unless the stack key says no."""
    config, plan = stack_plan
    assert plan.one(NODE_GROUP, "gpu").inputs["nodeRepairConfig"] == {"enabled": True}
    [agent] = node_monitoring_addons(plan)
    version = config.get("eks-ray-train:kubernetesVersion", "1.36").strip('"')
    assert agent.inputs["addonVersion"] == NODE_MONITORING_VERSIONS[version]
    assert agent.inputs["resolveConflictsOnCreate"] == "OVERWRITE"
    # On the node groups: EKS calls the add-on active once its DaemonSets run.
    for group in ("system", "gpu"):
        assert plan.one(NODE_GROUP, group).urn in agent.dependencies, group
    # The system group is not repaired: its nodes hold the Ray head and the operator, and no
    # condition of theirs was asked to be acted on.
    assert "nodeRepairConfig" not in plan.one(NODE_GROUP, "system").inputs


def test_auto_repair_off_turns_the_repair_off_and_installs_no_agent():
    plan = run_program(dev_config(gpuNodeAutoRepair="false"), FakeAws(region="us-east-2"))
    assert plan.one(NODE_GROUP, "gpu").inputs["nodeRepairConfig"] == {"enabled": False}
    assert node_monitoring_addons(plan) == []


def test_the_agents_dcgm_server_tolerates_the_gpu_taint(stack_plan):
    """The agent's chart tolerates every taint for its node agent and none for its DCGM server
    (aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/values.yaml); the GPU nodes carry
    the GPU taint, so the configuration gives the DCGM server the toleration that matches it
    (Kubernetes' rule: key equal, operator Exists, effect equal)."""
    _, plan = stack_plan
    [agent] = node_monitoring_addons(plan)
    values = json.loads(agent.inputs["configurationValues"])
    assert set(values) <= {"global", "nodeAgent", "dcgmAgent", "extraObjects"}  # the add-on's schema
    taint = plan.one(NODE_GROUP, "gpu").inputs["taints"][0]
    effect = {"NO_SCHEDULE": "NoSchedule"}[taint["effect"]]
    assert any(
        toleration.get("key") == taint["key"]
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == effect
        for toleration in values["dcgmAgent"]["tolerations"]
    )
