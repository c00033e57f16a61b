"""The GPU nodes' EC2 instances: the instance id in each node's `spec.providerID`, and the instance's
launch time from `ec2:DescribeInstances`, from which the run's GPU node hours are counted
(`infra.plan.cost`).

On EKS a node's providerID is `aws:///<zone>/<instance id>`, set by the AWS cloud provider when the
node registers (Kubernetes API reference, NodeSpec `providerID`: `<ProviderName>://<ProviderSpecificNodeID>`). DescribeInstances with `InstanceId.N`
answers each instance's `LaunchTime` (EC2 API reference, `Instance`): when it was launched, or last
started after a stop. A refused or failed call is `LaunchTimesUnavailable`, whose one line says why:
the cost then says its figures are unavailable, and no hours are made up from another clock.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import botocore.exceptions

from workloads.training_run.errors import aws_refusal

PROVIDER_ID = re.compile(r"aws:///[^/]*/(i-[0-9a-f]+)")

LaunchTimes = Callable[[Sequence[str]], Mapping[str, datetime.datetime]]


class LaunchTimesUnavailable(Exception):
    """The instances' launch times could not be read; the message says why, in one line."""


def instance_id(provider_id: str) -> str | None:
    """The EC2 instance id of a node's providerID, or None for one that is not an EC2 instance's."""
    match = PROVIDER_ID.fullmatch(provider_id)
    return match.group(1) if match else None


def no_launch_times(_ids: Sequence[str]) -> Mapping[str, datetime.datetime]:
    """An environment without the EC2 API (a local Ray head)."""
    raise LaunchTimesUnavailable("this environment has no EC2 API to read the nodes' launch times from")


def ec2_launch_times(ec2: Any, identity: str) -> LaunchTimes:
    """Launch times by instance id from DescribeInstances, called with the boto3 EC2 client `ec2`
    as `identity` (for the message when AWS refuses)."""

    def launch_times(ids: Sequence[str]) -> Mapping[str, datetime.datetime]:
        try:
            answer = ec2.describe_instances(InstanceIds=list(ids))
        except botocore.exceptions.ClientError as error:
            raise LaunchTimesUnavailable(
                f"AWS refused ec2:DescribeInstances of {', '.join(ids)} for {identity}: {aws_refusal(error)}"
            ) from error
        except botocore.exceptions.BotoCoreError as error:
            raise LaunchTimesUnavailable(f"the EC2 API did not answer DescribeInstances: {error}") from error
        return {
            instance["InstanceId"]: instance["LaunchTime"]
            for reservation in answer.get("Reservations", [])
            for instance in reservation.get("Instances", [])
        }

    return launch_times
