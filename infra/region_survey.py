"""Pick a region and zone for the GPU nodes before creating a stack: a read-only survey with boto3.

    python -m infra.region_survey --regions us-east-2 us-west-2 eu-central-1 \
        [--instance-type g6.12xlarge] [--count 2] [--json]

For each region it asks EC2 which zones offer the instance type and whether the type supports
EFA, reads the On-Demand vCPU quota of the type's class from Service Quotas, and subtracts the
vCPUs of the On-Demand instances of that class already pending or running in the region
(`ec2:DescribeInstances`, each counted at its type's default vCPUs; Spot has its own quota).
It prints one row per zone (one per region that cannot be used), ranked by standing (`ZONE_STANDINGS`,
usable first), then by quota headroom. Zones where EKS cannot place a control plane
(`infra.aws_rules.capacity_rules.EKS_UNSUPPORTED_ZONE_IDS`) are left out, as `pulumi preview` leaves them out.

Only read calls are made: ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings,
ec2:DescribeInstanceTypes, ec2:DescribeInstances, servicequotas:GetServiceQuota and
servicequotas:GetAWSDefaultServiceQuota.

No read-only AWS API can promise that capacity is free right now (see `CAPACITY_CAVEAT`).

Exit status: 0 when the survey was printed and at least one region answered; 1 when AWS could not
be called at all (credentials) or no region answered (the table still says why, region by region);
2 for bad arguments.

The instance-family to quota table lives here, without Pulumi, and `infra.preflight` uses it too;
the judgements (EFA, quota shortfall, usable zones) come from `infra.aws_rules.capacity_rules`, as preflight's do.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
)

from infra.aws_rules.capacity_rules import (
    VcpuQuota,
    eks_zones,
    has_efa,
    on_demand_vcpu_quota,
    quota_increase_command,
    usable_zones,
    vcpu_shortfall,
)
from platform_contract import INSTANCE_TYPE, REGION

CAPACITY_CAVEAT = (
    "No read-only AWS API can promise that capacity is free right now: an offering says the zone sells the type, "
    "the quota says the account may run it, and a launch can still fail with InsufficientInstanceCapacity. "
    "To be sure of the instances, create an On-Demand Capacity Reservation in the chosen zone, inside a cluster "
    "placement group so the nodes sit close for EFA (`aws ec2 create-placement-group --strategy cluster`, then "
    "`aws ec2 create-capacity-reservation --placement-group-arn ...`), and set capacityReservationId: the stack "
    "then creates no placement group of its own and launches into the reservation's."
)


# A zone's standing, best first: the ranking order. Its field and column keep the name `verdict`,
# which scripts read.
ZONE_STANDINGS = ("ok", "quota-unknown", "quota-short", "no-efa", "not-offered", "error")


@dataclass(frozen=True)
class ZoneReport:
    """One row of the survey: a zone that offers the type, or a whole region that cannot be used.

    `verdict` is one of `ZONE_STANDINGS` and holds for the whole region; `detail` says why, with the fix.
    """

    region: str
    zone: str | None
    zone_id: str | None
    verdict: str
    detail: str
    instance_type: str
    vcpus_needed: int | None = None
    efa_interfaces: int | None = None
    quota_code: str | None = None
    quota_vcpus: float | None = None
    used_vcpus: int | None = None

    @property
    def headroom_vcpus(self) -> float | None:
        if self.quota_vcpus is None or self.used_vcpus is None:
            return None
        return self.quota_vcpus - self.used_vcpus

    def as_json(self) -> dict:
        return {**asdict(self), "headroom_vcpus": self.headroom_vcpus}


ClientFactory = Callable[[str, str], Any]


def aws_client(service: str, region: str):
    """A boto3 client from the default credential chain (profile, environment, SSO, instance role)."""
    return boto3.client(service, region_name=region)


def _quota_value(quotas, quota: VcpuQuota) -> float:
    """The applied quota, or AWS's default where the account never changed it (as the Pulumi invoke does)."""
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=quota.code)["Quota"]["Value"])
    except ClientError as err:
        if err.response["Error"]["Code"] != "NoSuchResourceException":
            raise
    return float(
        quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=quota.code)["Quota"]["Value"]
    )


def _vcpus_in_use(ec2, quota: VcpuQuota) -> int:
    """Default vCPUs of the On-Demand instances pending or running in the region that count against `quota`.

    The default vCPU count of each type errs on the safe side: an instance launched with fewer
    cores (CPU options) may count less.
    """
    running: Counter[str] = Counter()
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                on_demand = instance.get("InstanceLifecycle") != "spot"
                if on_demand and on_demand_vcpu_quota(instance["InstanceType"]) == quota:
                    running[instance["InstanceType"]] += 1
    types = sorted(running)
    used = 0
    for start in range(0, len(types), 100):  # DescribeInstanceTypes takes at most 100 names
        for facts in ec2.describe_instance_types(InstanceTypes=types[start : start + 100])["InstanceTypes"]:
            used += running[facts["InstanceType"]] * facts["VCpuInfo"]["DefaultVCpus"]
    return used


def _offering_zones(ec2, instance_type: str) -> set[str]:
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    return {offering["Location"] for page in pages for offering in page["InstanceTypeOfferings"]}


def _eks_zones(ec2) -> dict[str, str]:
    """Zone name -> zone ID of the region's available zones that can hold an EKS control plane subnet."""
    response = ec2.describe_availability_zones(
        Filters=[
            {"Name": "zone-type", "Values": ["availability-zone"]},
            {"Name": "state", "Values": ["available"]},
        ]
    )
    return eks_zones({zone["ZoneName"]: zone["ZoneId"] for zone in response["AvailabilityZones"]})


class CredentialsError(Exception):
    """AWS found no usable credentials for the caller: no region can be surveyed."""


_CREDENTIAL_ERRORS = (
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
    CredentialRetrievalError,
)
_CREDENTIAL_ERROR_CODES = ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "RequestExpired")


def _region_failure(err: ClientError | BotoCoreError) -> str:
    """Describe an AWS failure that concerns one region; raise `CredentialsError` when it concerns them all."""
    if isinstance(err, _CREDENTIAL_ERRORS):
        raise CredentialsError(str(err)) from err
    if isinstance(err, ClientError):
        error = err.response["Error"]
        if error["Code"] in _CREDENTIAL_ERROR_CODES:
            raise CredentialsError(f"{error['Code']}: {error.get('Message', '')}") from err
        return f"{error['Code']}: {error.get('Message', '')}"
    return str(err)


def survey_region(region: str, instance_type: str, count: int, client: ClientFactory) -> list[ZoneReport]:
    """Rows for one region; its AWS errors become an `error` row, credential errors stop the survey."""
    try:
        ec2 = client("ec2", region)
        zones = _eks_zones(ec2)
        offered = usable_zones(_offering_zones(ec2, instance_type), zones)
        if not offered:
            detail = f"no zone of {region} offers {instance_type}"
            return [ZoneReport(region, None, None, "not-offered", detail, instance_type)]
        facts = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"][0]
    except (ClientError, BotoCoreError) as err:
        return [ZoneReport(region, None, None, "error", _region_failure(err), instance_type)]

    vcpus_needed = count * facts["VCpuInfo"]["DefaultVCpus"]
    network = facts["NetworkInfo"]
    efa_supported = bool(network.get("EfaSupported"))
    efa_interfaces = network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if efa_supported else 0
    quota = on_demand_vcpu_quota(instance_type)
    quota_vcpus = used_vcpus = None
    if not has_efa(efa_supported, efa_interfaces):
        verdict, detail = "no-efa", f"{instance_type} does not support EFA"
    elif quota is None:
        verdict, detail = "quota-unknown", f"no On-Demand vCPU quota is known for {instance_type}"
    else:
        try:
            quota_vcpus = _quota_value(client("service-quotas", region), quota)
            used_vcpus = _vcpus_in_use(ec2, quota)
        except (ClientError, BotoCoreError) as err:
            verdict, detail = (
                "quota-unknown",
                f"could not read the quota or its usage: {_region_failure(err)}",
            )
        else:
            headroom = quota_vcpus - used_vcpus
            if not vcpu_shortfall(quota_vcpus, used_vcpus, vcpus_needed):
                verdict, detail = "ok", f"{headroom:g} vCPU of '{quota.name}' free, {vcpus_needed} needed"
            else:
                verdict = "quota-short"
                detail = (
                    f"'{quota.name}' is {quota_vcpus:g} vCPU with {used_vcpus} in use, {vcpus_needed} needed; "
                    f"request more: {quota_increase_command(quota, used_vcpus + vcpus_needed, region)}"
                )
    return [
        ZoneReport(
            region,
            zone,
            zones[zone],
            verdict,
            detail,
            instance_type,
            vcpus_needed=vcpus_needed,
            efa_interfaces=efa_interfaces,
            quota_code=quota.code if quota else None,
            quota_vcpus=quota_vcpus,
            used_vcpus=used_vcpus,
        )
        for zone in offered
    ]


def rank(reports: Sequence[ZoneReport]) -> list[ZoneReport]:
    """Usable zones first, then by most quota headroom; ties in region and zone name order."""
    return sorted(
        reports,
        key=lambda report: (
            ZONE_STANDINGS.index(report.verdict),
            -(report.headroom_vcpus or 0),
            report.region,
            report.zone or "",
        ),
    )


def format_table(ranked: Sequence[ZoneReport]) -> str:
    header = ("#", "REGION", "ZONE", "ZONE ID", "EFA", "QUOTA", "IN USE", "HEADROOM", "NEED", "VERDICT")
    rows = [header]
    for position, report in enumerate(ranked, 1):
        rows.append(
            (
                str(position),
                report.region,
                report.zone or "-",
                report.zone_id or "-",
                "-" if report.efa_interfaces is None else str(report.efa_interfaces),
                "-" if report.quota_vcpus is None else f"{report.quota_vcpus:g}",
                "-" if report.used_vcpus is None else str(report.used_vcpus),
                "-" if report.headroom_vcpus is None else f"{report.headroom_vcpus:g}",
                "-" if report.vcpus_needed is None else str(report.vcpus_needed),
                report.verdict,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    notes = list(
        dict.fromkeys(f"{report.region}: {report.detail}" for report in ranked if report.verdict != "ok")
    )
    best = ranked[0] if ranked and ranked[0].verdict == "ok" else None
    if best:
        notes.insert(
            0, f"best: pulumi config set aws:region {best.region} && pulumi config set gpuAz {best.zone}"
        )
    return "\n".join([*lines, "", *notes, "", CAPACITY_CAVEAT])


def _matching(pattern: re.Pattern[str], example: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r} does not look like {example}")
        return text

    return parse


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m infra.region_survey",
        description="Rank regions and zones for the GPU node group (read-only AWS calls). " + CAPACITY_CAVEAT,
    )
    parser.add_argument(
        "--regions",
        nargs="+",
        required=True,
        type=_matching(REGION, "us-east-2"),
        metavar="REGION",
        help="regions to survey, e.g. us-east-2 us-west-2",
    )
    parser.add_argument(
        "--instance-type",
        default="g6.12xlarge",
        type=_matching(INSTANCE_TYPE, "g6.12xlarge"),
        help="GPU node type (default g6.12xlarge)",
    )
    parser.add_argument("--count", default=2, type=_positive, help="GPU nodes wanted (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, client: ClientFactory = aws_client) -> int:
    args = parse_args(argv)
    try:
        reports = [
            report
            for region in dict.fromkeys(args.regions)
            for report in survey_region(region, args.instance_type, args.count, client)
        ]
    except CredentialsError as err:
        print(
            f"error: no usable AWS credentials ({err}). Run `aws configure` or `aws sso login`, "
            "or set AWS_PROFILE / AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
            file=sys.stderr,
        )
        return 1
    ranked = rank(reports)
    if args.json:
        print(
            json.dumps(
                {
                    "instance_type": args.instance_type,
                    "count": args.count,
                    "ranked": [report.as_json() for report in ranked],
                    "caveat": CAPACITY_CAVEAT,
                },
                indent=2,
            )
        )
    else:
        print(format_table(ranked))
    return 1 if all(report.verdict == "error" for report in ranked) else 0


if __name__ == "__main__":
    sys.exit(main())
