"""The On-Demand vCPU quotas against the node groups: the numbers, the request command, the permission."""

from __future__ import annotations

import logging

from infra.preflight import quotas
from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import QUOTA_TOKEN, place, refusal


def test_type_without_a_known_vcpu_quota_is_reported_not_blocked(caplog, monkeypatch):
    """A family the quota table does not know yet (Mac types, the table's one family without a vCPU
    quota, are refused earlier for their architecture): the preview warns and goes on."""
    caplog.set_level(logging.WARNING)
    known = quotas.on_demand_vcpu_quota
    monkeypatch.setattr(
        quotas, "on_demand_vcpu_quota", lambda name: None if name == "m7i.xlarge" else known(name)
    )
    _, gpu_az, _ = place(FakeAws())
    assert gpu_az == "us-east-2a"
    assert "no On-Demand vCPU quota is known for m7i.xlarge" in caplog.text


def test_gpu_quota_too_small_gives_numbers_and_the_request_command():
    message = refusal(FakeAws(quotas={"L-DB2E81BA": 64}))
    assert "'Running On-Demand G and VT instances' (L-DB2E81BA) in us-east-2 is 64" in message
    assert "2 x g6.12xlarge (48 vCPU each) need 96" in message
    assert (
        "`aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA "
        "--desired-value 96 --region us-east-2`" in message
    )
    assert "vCPUs of instances already running in the region count against it too" in message


def test_quota_exactly_covering_the_gpu_nodes_passes():
    _, gpu_az, _ = place(FakeAws(quotas={"L-DB2E81BA": 96}))
    assert gpu_az == "us-east-2a"


def test_node_groups_sharing_a_quota_are_added_up():
    message = refusal(FakeAws(quotas={"L-DB2E81BA": 96}), systemNodeType="g4dn.xlarge")
    assert "2 x g6.12xlarge (48 vCPU each) + 1 x g4dn.xlarge (4 vCPU each) need 100" in message
    assert "--desired-value 100" in message


def test_system_node_quota_too_small():
    message = refusal(FakeAws(quotas={"L-1216C47A": 2}), systemNodeType="m7i.xlarge")
    assert "'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances' (L-1216C47A)" in message
    assert "--quota-code L-1216C47A --desired-value 4" in message


def test_quota_that_cannot_be_read_names_the_permission():
    message = refusal(FakeAws(denied={QUOTA_TOKEN}))
    assert "could not read the vCPU quota" in message
    assert "AccessDeniedException" in message
    assert "servicequotas:GetServiceQuota" in message
