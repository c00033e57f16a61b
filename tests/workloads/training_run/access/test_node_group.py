"""The GPU node group over the EKS API: botocore's own client, its answers stubbed (botocore Stubber
checks each request against the EKS service model)."""

from __future__ import annotations

import datetime

import boto3
import pytest
from botocore.stub import Stubber

from workloads.training_run.access.node_group import EksNodeGroup, NodeGroupFacts
from workloads.training_run.errors import TrainingRunError

WHERE = {"clusterName": "eks-ray-train", "nodegroupName": "gpu-0a1b2c3"}


def sized() -> tuple[EksNodeGroup, Stubber]:
    eks = boto3.session.Session(
        aws_access_key_id="AKIAFAKE", aws_secret_access_key="fake", region_name="us-east-2"
    ).client("eks")
    return EksNodeGroup(eks, "eks-ray-train", "gpu-0a1b2c3", "us-east-2"), Stubber(eks)


def test_describe_reads_status_desired_size_and_health_issues():
    group, stub = sized()
    issue = {
        "code": "AsgInstanceLaunchFailures",
        "message": "InsufficientInstanceCapacity",
        "resourceIds": ["eks-gpu-asg"],
    }
    answer = {
        "nodegroup": {
            "status": "DEGRADED",
            "scalingConfig": {"desiredSize": 0},
            "health": {"issues": [issue]},
        }
    }
    stub.add_response("describe_nodegroup", answer, WHERE)
    with stub:
        facts = group.describe()
    assert facts == NodeGroupFacts(
        "gpu-0a1b2c3",
        "DEGRADED",
        0,
        ("AsgInstanceLaunchFailures: InsufficientInstanceCapacity (eks-gpu-asg)",),
    )


def test_a_resize_sends_the_desired_size_alone_and_answers_when_eks_accepted_it_in_utc():
    group, stub = sized()
    accepted = datetime.datetime(2027, 1, 15, 9, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    stub.add_response(
        "update_nodegroup_config",
        {"update": {"id": "u-1", "status": "InProgress", "type": "ConfigUpdate", "createdAt": accepted}},
        {**WHERE, "scalingConfig": {"desiredSize": 0}},
    )
    with stub:
        assert group.set_desired_size(0) == "2027-01-15T08:00:00Z"


def test_a_refused_resize_names_the_call_the_group_and_eks_reason():
    group, stub = sized()
    message = "Nodegroup cannot be updated as it is currently not in Active State"
    stub.add_client_error("update_nodegroup_config", "ResourceInUseException", message, 409)
    with stub, pytest.raises(TrainingRunError) as caught:
        group.set_desired_size(2)
    assert str(caught.value) == (
        "AWS refused UpdateNodegroupConfig of node group gpu-0a1b2c3 of EKS cluster eks-ray-train in us-east-2: "
        f"ResourceInUseException: {message}"
    )
