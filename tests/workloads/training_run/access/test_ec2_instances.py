"""What the run's `gpu_nodes` output says of each GPU node's instance from EC2's answer: its launch, its
stop when it no longer runs, or why its hours cannot be counted."""

from __future__ import annotations

import datetime

from workloads.training_run.access.ec2_instances import InstanceLife, instance_id, instance_record

LAUNCHED = datetime.datetime(2026, 12, 5, 7, 0, 0, tzinfo=datetime.UTC)


def test_the_instance_id_is_the_providerids_last_part():
    assert instance_id("aws:///us-east-2a/i-0a1b2c3d4e5f60001") == "i-0a1b2c3d4e5f60001"
    assert instance_id("kind://docker/kind/kind-worker") is None


def test_a_running_instance_has_its_launch_a_terminated_one_its_stop_too():
    assert instance_record("i-1", InstanceLife(LAUNCHED, "running")) == {
        "instanceId": "i-1",
        "launchTime": "2026-12-05T07:00:00+00:00",
    }
    terminated = InstanceLife(LAUNCHED, "terminated", "User initiated (2026-12-05 08:10:00 GMT)")
    assert instance_record("i-2", terminated)["stoppedAt"] == "2026-12-05T08:10:00+00:00"


def test_an_instance_ec2_no_longer_lists_or_stopped_at_no_given_time_is_named_not_guessed():
    assert "does not list it" in instance_record("i-3", None)["unavailable"]
    stopped = instance_record("i-4", InstanceLife(LAUNCHED, "stopped", ""))
    assert "stoppedAt" not in stopped
    assert stopped["unavailable"].startswith("it is stopped and EC2 gives no time it stopped running")
