"""The GPU nodes' EC2 instances: the instance id in each node's `spec.providerID`, and what
`ec2:DescribeInstances` says of each instance (when it was launched, its state, when it stopped
running), from which the run's GPU node hours are counted (`infra.planner.cost`).

On EKS a node's providerID is `aws:///<zone>/<instance id>`, set by the AWS cloud provider when the
node registers (Kubernetes API reference, NodeSpec `providerID`: `<ProviderName>://<ProviderSpecificNodeID>`).
DescribeInstances answers each instance's `LaunchTime` (EC2 API reference, `Instance`: when it was
launched, or last started after a stop), its `State` and its `StateTransitionReason` ("the reason
for the most recent state transition"), which EC2 writes for an instance stopped or terminated as
the transition's cause and time, `User initiated (2026-12-05 08:10:00 GMT)`; the reference gives no
format, so a reason without that time leaves the instance's hours uncounted rather than guessed.
The instances are asked for with the `instance-id` filter, not `InstanceId.N`: with the ids, one id
EC2 no longer knows (terminated instances stay visible for about an hour: EC2 API reference,
TerminateInstances) fails the whole call with InvalidInstanceID.NotFound, while a filter answers the
instances EC2 knows and leaves that one out, which `instance_record` then names. A refused or failed call is `LaunchTimesUnavailable`, whose
one line says why: the cost then says its measured values are unavailable, and no hours are made up from
another clock.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from workloads.training_run.errors import aws_refusal

PROVIDER_ID = re.compile(r"aws:///[^/]*/(i-[0-9a-f]+)")
# The states counted to the run's end: EC2 bills an instance while it is `running`, and not once it
# is stopping, stopped, shutting down or terminated (EC2 user guide, "Amazon EC2 instance state
# changes"); `pending` is the few seconds before, which `LaunchTime` starts.
RUNNING_STATES = ("pending", "running")
# The transition's time in `StateTransitionReason`.
TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) GMT\)")


@dataclass(frozen=True)
class InstanceLife:
    """What EC2 says of one instance: its launch, its state and its state transition reason."""

    launched: datetime.datetime
    state: str
    transition_reason: str = ""


LaunchTimes = Callable[[Sequence[str]], Mapping[str, InstanceLife]]


class LaunchTimesUnavailable(Exception):
    """The instances could not be described; the message says why, in one line."""


def instance_id(provider_id: str) -> str | None:
    """The EC2 instance id of a node's providerID, or None for one that is not an EC2 instance's."""
    match = PROVIDER_ID.fullmatch(provider_id)
    return match.group(1) if match else None


def instance_record(instance: str, life: InstanceLife | None) -> dict[str, str]:
    """One GPU node's instance as the run's `gpu_nodes` output holds it: `instanceId`, `launchTime`,
    and `stoppedAt` for one that stopped running, all ISO 8601 UTC; `unavailable` says why its hours
    cannot be counted: EC2 no longer knows it, or it stopped at a time EC2 does not give."""
    if life is None:
        return {
            "instanceId": instance,
            "unavailable": "ec2:DescribeInstances does not list it (EC2 lists a terminated instance for "
            "about an hour), so its launch is unknown and its hours are not counted",
        }
    record = {"instanceId": instance, "launchTime": life.launched.astimezone(datetime.UTC).isoformat()}
    if life.state in RUNNING_STATES:
        return record
    stopped = TRANSITION_TIME.search(life.transition_reason)
    if stopped is None:
        return {
            **record,
            "unavailable": f"it is {life.state} and EC2 gives no time it stopped running "
            f"({life.transition_reason or 'no state transition reason'}), so its hours are not counted",
        }
    at = datetime.datetime.strptime(stopped.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)
    return {**record, "stoppedAt": at.isoformat()}


def no_launch_times(_ids: Sequence[str]) -> Mapping[str, InstanceLife]:
    """An environment without the EC2 API (a local Ray head)."""
    raise LaunchTimesUnavailable("this environment has no EC2 API to read the nodes' launch times from")


def ec2_launch_times(ec2: Any, identity: str) -> LaunchTimes:
    """The instances EC2 still lists among `ids`, by id, from DescribeInstances filtered by
    `instance-id`, called with the boto3 EC2 client `ec2` as `identity` (for the message when AWS
    refuses)."""

    def launch_times(ids: Sequence[str]) -> Mapping[str, InstanceLife]:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": list(ids)}]
        )
        try:
            instances = [
                instance
                for page in pages
                for reservation in page.get("Reservations", [])
                for instance in reservation.get("Instances", [])
            ]
        except botocore.exceptions.ClientError as error:
            raise LaunchTimesUnavailable(
                f"AWS refused ec2:DescribeInstances of {', '.join(ids)} for {identity}: {aws_refusal(error)}"
            ) from error
        except botocore.exceptions.BotoCoreError as error:
            raise LaunchTimesUnavailable(f"the EC2 API did not answer DescribeInstances: {error}") from error
        return {
            instance["InstanceId"]: InstanceLife(
                instance["LaunchTime"], instance["State"]["Name"], instance.get("StateTransitionReason", "")
            )
            for instance in instances
        }

    return launch_times
