"""The GPU nodes' EC2 launch times the run outputs for its cost, through the TrainingRun's runs."""

from __future__ import annotations

import datetime

from infra.planner.cost import CostBasis, PredictedRun, list_price, measured_cost, predicted_cost
from tests.harness.training_run_fakes import (
    INSTANCE_IDS,
    LAUNCHED,
    OUTPUT_TIME,
    FakeCluster,
    gpu_node,
    main_and_tcp_head,
    props,
    run_inputs,
)

# --- the GPU nodes' launch times, for the stack's `training.cost` ----------------------------------


def test_a_run_outputs_each_gpu_nodes_instance_and_launch_and_the_outputs_time():
    """Read after the job: the instances the nodes' providerID names, their EC2 launch times
    (DescribeInstances, stubbed on EC2's own service model), and the output's time from the run's
    wall clock; the cost of the fake cluster then counts from them at the price the run recorded."""
    price = list_price("g6.12xlarge", "us-east-2", None, "the invoke was refused")
    basis = CostBasis(price, None, {})
    fake = FakeCluster(main_and_tcp_head())
    outs = fake.provider().create(props(run_inputs(planned=basis.predicted_run))).outs
    assert PredictedRun.recorded(outs["planned"], "training.cost.measured") == basis.predicted_run
    assert outs["gpu_nodes"] == {
        "node-a": {"instanceId": "i-0a1b2c3d4e5f60001", "launchTime": "2026-12-05T07:00:00+00:00"},
        "node-b": {"instanceId": "i-0a1b2c3d4e5f60002", "launchTime": "2026-12-05T07:00:30+00:00"},
    }
    assert outs["gpu_nodes_unavailable"] is None
    finished = OUTPUT_TIME + datetime.timedelta(seconds=fake.clock.now)
    assert outs["finished_at"] == finished.isoformat()
    measured = measured_cost(
        PredictedRun.recorded(outs["planned"], "training.cost.measured"),
        outs["gpu_nodes"],
        None,
        outs["finished_at"],
        outs["summary"],
    )
    seconds = (
        2 * 2 * 3600 + 2 * fake.clock.now - 30
    )  # two nodes launched 2 h and 1 h 59 min 30 s before 09:00
    assert measured["gpuNodeHours"] == round(seconds / 3600, 4)
    assert measured["usd"] == round(seconds / 3600 * 4.6016, 2)
    assert predicted_cost(basis)["priceBasis"].startswith(
        "On-Demand list price of g6.12xlarge shipped with the stack"
    )


def test_ec2_refusing_describe_instances_makes_the_launch_times_unavailable_not_the_run():
    fake = FakeCluster(main_and_tcp_head(), ec2_refused="UnauthorizedOperation")
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["status"] == "SUCCEEDED" and outs["gpu_nodes"] is None
    assert outs["gpu_nodes_unavailable"] == (
        "AWS refused ec2:DescribeInstances of i-0a1b2c3d4e5f60001, i-0a1b2c3d4e5f60002 for the ambient AWS "
        "credentials: UnauthorizedOperation: You are not authorized to perform this operation."
    )
    assert any("launch times are unavailable" in line for line in fake.logged)


def test_a_node_without_an_instance_id_makes_the_launch_times_unavailable():
    bare = gpu_node("node-b")
    bare.spec.provider_id = None
    fake = FakeCluster(main_and_tcp_head(), nodes=[gpu_node("node-a"), bare])
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["gpu_nodes"] is None
    assert outs["gpu_nodes_unavailable"] == "node(s) node-b carry no EC2 instance id in spec.providerID"


def hours_of(fake: FakeCluster, outs: dict) -> dict:
    basis = CostBasis(list_price("g6.12xlarge", "us-east-2", None, "the invoke was refused"), None, {})
    return measured_cost(
        basis.predicted_run,
        outs["gpu_nodes"],
        outs["gpu_nodes_unavailable"],
        outs["finished_at"],
        outs["summary"],
    )


def test_a_node_replaced_during_the_run_counts_both_instances_hours():
    """node-b's instance is terminated at 08:30 while the gate runs and node-c's launched in its place:
    the nodes listed after each job hold node-c, the readiness wait's held node-b; both are counted,
    node-b's to its termination (its StateTransitionReason), node-c's to the output."""
    replaced_at = datetime.datetime(2026, 12, 5, 8, 30, 0, tzinfo=datetime.UTC)
    launched_c = datetime.datetime(2026, 12, 5, 8, 31, 0, tzinfo=datetime.UTC)
    fake = FakeCluster(
        main_and_tcp_head(),
        node_snapshots=[[gpu_node("node-a"), gpu_node("node-b")], [gpu_node("node-a"), gpu_node("node-c")]],
        launched={**LAUNCHED, INSTANCE_IDS["node-c"]: launched_c},
        stopped={INSTANCE_IDS["node-b"]: replaced_at},
    )
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["gpu_nodes"]["node-b"] == {
        "instanceId": INSTANCE_IDS["node-b"],
        "launchTime": "2026-12-05T07:00:30+00:00",
        "stoppedAt": "2026-12-05T08:30:00+00:00",
    }
    assert outs["gpu_nodes"]["node-c"] == {
        "instanceId": INSTANCE_IDS["node-c"],
        "launchTime": "2026-12-05T08:31:00+00:00",
    }
    end = OUTPUT_TIME + datetime.timedelta(seconds=fake.clock.now)
    seconds = (
        (end - LAUNCHED[INSTANCE_IDS["node-a"]]).total_seconds()
        + (replaced_at - LAUNCHED[INSTANCE_IDS["node-b"]]).total_seconds()
        + (end - launched_c).total_seconds()
    )
    measured = hours_of(fake, outs)
    assert measured["gpuNodeHours"] == round(seconds / 3600, 4) and measured["notCounted"] is None


def test_a_node_that_never_became_ready_is_counted_too():
    """A third GPU node NotReady at the first poll of the readiness wait and gone at the next: EC2 billed
    it, so its instance is among the run's."""
    stuck = gpu_node("node-c", ready=False)
    fake = FakeCluster(
        main_and_tcp_head(),
        node_snapshots=[
            [gpu_node("node-a"), gpu_node("node-b"), stuck],
            [gpu_node("node-a"), gpu_node("node-b")],
        ],
        launched={
            **LAUNCHED,
            INSTANCE_IDS["node-c"]: datetime.datetime(2026, 12, 5, 7, 1, tzinfo=datetime.UTC),
        },
    )
    outs = fake.provider().create(props(run_inputs())).outs
    assert sorted(outs["gpu_nodes"]) == ["node-a", "node-b", "node-c"]


def test_an_instance_ec2_no_longer_lists_is_named_and_the_others_counted_not_a_refusal():
    """node-b's instance terminated more than an hour ago is gone from DescribeInstances: asked by the
    `instance-id` filter EC2 answers node-a's alone (with the ids it would refuse the whole call,
    InvalidInstanceID.NotFound); node-b is named, node-a's hours counted."""
    fake = FakeCluster(
        main_and_tcp_head(), launched={INSTANCE_IDS["node-a"]: LAUNCHED[INSTANCE_IDS["node-a"]]}
    )
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["gpu_nodes_unavailable"] is None
    assert outs["gpu_nodes"]["node-b"] == {
        "instanceId": INSTANCE_IDS["node-b"],
        "unavailable": "ec2:DescribeInstances does not list it (EC2 lists a terminated instance for about an "
        "hour), so its launch is unknown and its hours are not counted",
    }
    measured = hours_of(fake, outs)
    end = OUTPUT_TIME + datetime.timedelta(seconds=fake.clock.now)
    assert measured["gpuNodeHours"] == round(
        (end - LAUNCHED[INSTANCE_IDS["node-a"]]).total_seconds() / 3600, 4
    )
    assert list(measured["notCounted"]) == [INSTANCE_IDS["node-b"]] and measured["unavailable"] is None
