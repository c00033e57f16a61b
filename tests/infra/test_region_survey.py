"""The region survey (`python -m infra.region_survey`) against moto's EC2 (real offerings and instance facts) and stubbed Service Quotas."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from infra import region_survey
from infra.aws_rules.capacity_rules import STANDARD_QUOTA, on_demand_vcpu_quota

G_QUOTA = "L-DB2E81BA"
MOTO_IMAGE = "ami-12c6146b"  # one of moto's default images


@pytest.fixture
def aws(monkeypatch):
    """A moto account with fake credentials; yields a helper to launch instances in it."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():

        def launch(region: str, instance_type: str, spot: bool = False) -> None:
            market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
            boto3.client("ec2", region_name=region).run_instances(
                ImageId=MOTO_IMAGE, InstanceType=instance_type, MinCount=1, MaxCount=1, **market
            )

        yield launch


def clients(quotas: dict[str, float | str], stubbed_ec2: dict | None = None, quota_code: str = G_QUOTA):
    """Client factory: moto's EC2 (or a given stubbed one), and Service Quotas answering `quotas` per region.

    A quota given as a string is the error code Service Quotas answers with instead.
    """
    quota_clients = {}
    for region, value in quotas.items():
        client = boto3.client("service-quotas", region_name=region)
        stubber = Stubber(client)
        expected = {"ServiceCode": "ec2", "QuotaCode": quota_code}
        if isinstance(value, str):
            stubber.add_client_error("get_service_quota", value, "not allowed", expected_params=expected)
        else:
            stubber.add_response(
                "get_service_quota", {"Quota": {"QuotaCode": quota_code, "Value": value}}, expected
            )
        stubber.activate()
        quota_clients[region] = client

    def client(service: str, region: str):
        if service == "service-quotas":
            return quota_clients[region]
        return (stubbed_ec2 or {}).get(region) or boto3.client(service, region_name=region)

    return client


def survey(capsys, argv: list[str], client) -> dict:
    assert region_survey.main([*argv, "--json"], client=client) == 0
    return json.loads(capsys.readouterr().out)


def test_ranks_zones_with_most_headroom_first_and_unusable_regions_last(aws, capsys):
    aws("us-east-2", "g6.12xlarge")
    aws("us-east-2", "g6.xlarge", spot=True)  # Spot has its own quota
    aws("us-east-2", "m5.large")  # another quota class
    result = survey(
        capsys,
        ["--regions", "us-west-2", "eu-west-1", "us-east-2", "us-east-1"],
        clients({"us-west-2": 192, "us-east-2": 192, "us-east-1": 64}),
    )
    rows = [(row["region"], row["zone"], row["verdict"], row["headroom_vcpus"]) for row in result["ranked"]]
    assert rows == [
        ("us-west-2", "us-west-2a", "ok", 192),
        ("us-west-2", "us-west-2b", "ok", 192),
        ("us-west-2", "us-west-2c", "ok", 192),
        ("us-west-2", "us-west-2d", "ok", 192),
        ("us-east-2", "us-east-2a", "ok", 144),
        ("us-east-2", "us-east-2b", "ok", 144),
        ("us-east-2", "us-east-2c", "ok", 144),
        ("us-east-1", "us-east-1a", "quota-short", 64),
        ("us-east-1", "us-east-1b", "quota-short", 64),
        ("us-east-1", "us-east-1c", "quota-short", 64),
        ("us-east-1", "us-east-1d", "quota-short", 64),
        ("us-east-1", "us-east-1f", "quota-short", 64),
        ("eu-west-1", None, "not-offered", None),
    ]
    best = result["ranked"][0]
    assert (best["zone_id"], best["efa_interfaces"], best["vcpus_needed"]) == ("usw2-az2", 1, 96)
    assert best["quota_code"] == G_QUOTA
    assert result["ranked"][4]["used_vcpus"] == 48
    assert "--quota-code L-DB2E81BA --desired-value 96 --region us-east-1" in result["ranked"][7]["detail"]
    assert "No read-only AWS API can promise that capacity is free right now" in result["caveat"]


def test_zones_where_eks_cannot_place_a_control_plane_are_left_out(aws, capsys):
    result = survey(
        capsys,
        ["--regions", "us-east-1", "--instance-type", "p5.48xlarge", "--count", "1"],
        clients({"us-east-1": 384}, quota_code="L-417A185B"),
    )
    zones = [row["zone"] for row in result["ranked"]]
    assert zones == [
        "us-east-1a",
        "us-east-1b",
        "us-east-1c",
        "us-east-1d",
        "us-east-1f",
    ]  # us-east-1e is use1-az3


def test_type_without_efa_is_ranked_below_usable_ones(aws, capsys):
    result = survey(
        capsys, ["--regions", "us-east-2", "--instance-type", "g6.xlarge", "--count", "1"], clients({})
    )
    assert {row["verdict"] for row in result["ranked"]} == {"no-efa"}
    assert result["ranked"][0]["detail"] == "g6.xlarge does not support EFA"


def test_efa_type_of_an_unknown_quota_class_is_listed_with_an_unknown_verdict(capsys):
    """A family newer than the quota table is still surveyed, not guessed into a quota."""
    ec2 = boto3.client("ec2", region_name="us-east-2", aws_access_key_id="a", aws_secret_access_key="b")
    stubber = Stubber(ec2)
    stubber.add_response(
        "describe_availability_zones",
        {"AvailabilityZones": [{"ZoneName": "us-east-2a", "ZoneId": "use2-az1"}]},
    )
    stubber.add_response(
        "describe_instance_type_offerings",
        {"InstanceTypeOfferings": [{"InstanceType": "e9.48xlarge", "Location": "us-east-2a"}]},
    )
    stubber.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                {
                    "InstanceType": "e9.48xlarge",
                    "VCpuInfo": {"DefaultVCpus": 192},
                    "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 4}},
                }
            ]
        },
    )
    stubber.activate()
    result = survey(
        capsys, ["--regions", "us-east-2", "--instance-type", "e9.48xlarge"], lambda service, region: ec2
    )
    [row] = result["ranked"]
    assert (row["zone"], row["verdict"], row["efa_interfaces"]) == ("us-east-2a", "quota-unknown", 4)
    assert row["quota_code"] is None


def test_quota_never_changed_falls_back_to_the_aws_default(aws, capsys):
    client = boto3.client("service-quotas", region_name="us-east-2")
    stubber = Stubber(client)
    expected = {"ServiceCode": "ec2", "QuotaCode": G_QUOTA}
    stubber.add_client_error("get_service_quota", "NoSuchResourceException", expected_params=expected)
    stubber.add_response("get_aws_default_service_quota", {"Quota": {"Value": 64.0}}, expected)
    stubber.activate()
    result = survey(
        capsys,
        ["--regions", "us-east-2", "--count", "1"],
        lambda service, region: (
            client if service == "service-quotas" else boto3.client(service, region_name=region)
        ),
    )
    assert [row["quota_vcpus"] for row in result["ranked"]] == [64.0, 64.0, 64.0]
    assert result["ranked"][0]["verdict"] == "ok"


def test_unreadable_quota_keeps_the_zones_with_an_unknown_verdict(aws, capsys):
    result = survey(capsys, ["--regions", "us-east-2"], clients({"us-east-2": "AccessDeniedException"}))
    assert [row["verdict"] for row in result["ranked"]] == ["quota-unknown"] * 3
    assert "AccessDeniedException" in result["ranked"][0]["detail"]


def test_a_region_that_fails_is_reported_and_the_others_still_surveyed(aws, capsys):
    refused = boto3.client("ec2", region_name="ap-east-1")
    stubber = Stubber(refused)
    stubber.add_client_error("describe_availability_zones", "OptInRequired", "region not enabled")
    stubber.activate()
    result = survey(
        capsys,
        ["--regions", "ap-east-1", "us-east-2"],
        clients({"us-east-2": 192}, stubbed_ec2={"ap-east-1": refused}),
    )
    assert result["ranked"][0]["region"] == "us-east-2"
    assert result["ranked"][-1]["verdict"] == "error"
    assert result["ranked"][-1]["detail"] == "OptInRequired: region not enabled"


def test_table_names_the_best_choice_and_the_caveat(aws, capsys):
    assert (
        region_survey.main(
            ["--regions", "us-east-2", "eu-west-1", "us-east-1"],
            client=clients({"us-east-2": 192, "us-east-1": 64}),
        )
        == 0
    )
    text = capsys.readouterr().out
    header, first = text.splitlines()[:2]
    assert header.split("  ")[0:2] == ["#", "REGION"] and "HEADROOM" in header
    assert first.split() == ["1", "us-east-2", "us-east-2a", "use2-az1", "1", "192", "0", "192", "96", "ok"]
    assert "best: pulumi config set aws:region us-east-2 && pulumi config set gpuAz us-east-2a" in text
    assert "eu-west-1: no zone of eu-west-1 offers g6.12xlarge" in text
    assert (
        text.count("--quota-code L-DB2E81BA --desired-value 96 --region us-east-1") == 1
    )  # one note per region
    assert "No read-only AWS API can promise that capacity is free right now" in text


def test_missing_credentials_exit_1_without_traceback(monkeypatch, tmp_path, capsys):
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert region_survey.main(["--regions", "us-east-2"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: no usable AWS credentials")
    assert "Traceback" not in captured.err


def test_expired_credentials_exit_1(capsys):
    expired = boto3.client("ec2", region_name="us-east-2", aws_access_key_id="a", aws_secret_access_key="b")
    stubber = Stubber(expired)
    stubber.add_client_error("describe_availability_zones", "ExpiredToken", "The security token is expired")
    stubber.activate()
    assert region_survey.main(["--regions", "us-east-2"], client=lambda service, region: expired) == 1
    assert "ExpiredToken" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--regions"],
        ["--regions", "Ohio"],
        ["--regions", "us-east-2", "--count", "0"],
        ["--regions", "us-east-2", "--instance-type", "G6 12XL"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        region_survey.main(argv, client=lambda service, region: pytest.fail("no AWS call expected"))
    assert exited.value.code == 2
    assert "usage: python -m infra.region_survey" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("instance_type", "code"),
    [
        ("g6.12xlarge", "L-DB2E81BA"),
        ("g6e.12xlarge", "L-DB2E81BA"),
        ("gr6.4xlarge", "L-DB2E81BA"),
        ("vt1.3xlarge", "L-DB2E81BA"),
        ("p5.48xlarge", "L-417A185B"),
        ("p4d.24xlarge", "L-417A185B"),
        ("inf2.48xlarge", "L-1945791B"),
        ("trn1.32xlarge", "L-2C3B7624"),
        ("dl1.24xlarge", "L-6E869C2A"),
        ("hpc7g.16xlarge", "L-F7808C92"),
        ("u-6tb1.metal", "L-43DA4232"),
        ("u7i-12tb.224xlarge", "L-43DA4232"),
        ("x2idn.16xlarge", "L-7295265B"),
        ("f2.12xlarge", "L-74FC7D96"),
        ("m7i.xlarge", STANDARD_QUOTA.code),
        ("t3.micro", STANDARD_QUOTA.code),
        ("im4gn.large", STANDARD_QUOTA.code),
        ("z1d.large", STANDARD_QUOTA.code),
    ],
)
def test_instance_types_map_to_their_vcpu_quota(instance_type, code):
    assert on_demand_vcpu_quota(instance_type).code == code


def test_mac_instances_have_no_on_demand_vcpu_quota():
    assert on_demand_vcpu_quota("mac2.metal") is None


def test_advice_puts_the_reservation_in_a_cluster_placement_group_the_stack_then_uses():
    """EC2 launches into a targeted reservation only where the placement matches, so the group is the reservation's."""
    assert "create-capacity-reservation --placement-group-arn" in region_survey.CAPACITY_CAVEAT
    assert "creates no placement group of its own" in region_survey.CAPACITY_CAVEAT


def test_no_region_answering_exits_1_with_the_table(capsys):
    """Every region unreachable (an endpoint that refuses, say): the survey is printed, and the
    exit status says that nothing was learned."""
    failing = boto3.client("ec2", region_name="us-east-2", aws_access_key_id="a", aws_secret_access_key="b")
    stubber = Stubber(failing)
    for _ in range(2):
        stubber.add_client_error(
            "describe_availability_zones", "InternalError", "We encountered an internal error"
        )
    stubber.activate()
    status = region_survey.main(
        ["--regions", "us-east-2", "us-west-2"], client=lambda service, region: failing
    )
    output = capsys.readouterr().out
    assert status == 1
    assert output.count("InternalError") >= 2 and "us-west-2" in output
