"""The contract: its rules against the real sources, and who may import whom."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import botocore
import pytest
import yaml
from kubernetes.utils import parse_quantity

import platform_contract
from infra.config.stack import ConfigError, parse_settings
from platform_contract import AVAILABILITY_ZONE, INSTANCE_TYPE, REGION, image_pin_problem, memory_mib
from tests.harness.import_graph import imported_modules
from tests.harness.paths import REPO_ROOT

ROOT = REPO_ROOT


def botocore_regions() -> list[str]:
    """Every region of every partition in the endpoints file of the installed botocore."""
    endpoints = json.loads((Path(botocore.__file__).parent / "data" / "endpoints.json").read_text())
    return [region for partition in endpoints["partitions"] for region in partition["regions"]]


def test_every_aws_region_and_its_zones_match_the_patterns():
    regions = botocore_regions()
    assert {"us-east-2", "us-gov-west-1", "cn-north-1", "ap-southeast-7"} <= set(regions)
    assert [region for region in regions if not REGION.fullmatch(region)] == []
    assert [region for region in regions if not AVAILABILITY_ZONE.fullmatch(f"{region}a")] == []


@pytest.mark.parametrize("name", ["us-east-2a", "US-EAST-2", "us-east", "useast2", "us-east-2 ", "us_east_2"])
def test_what_is_no_region(name):
    assert not REGION.fullmatch(name)


@pytest.mark.parametrize("name", ["us-east-2", "us-east-2ab", "us-east-2A", "use2-az1"])
def test_what_is_no_zone_name(name):
    assert not AVAILABILITY_ZONE.fullmatch(name)


@pytest.mark.parametrize(
    "name", ["g6.12xlarge", "p5.48xlarge", "m7i.xlarge", "u-6tb1.metal", "trn1n.32xlarge"]
)
def test_instance_types(name):
    assert INSTANCE_TYPE.fullmatch(name)


@pytest.mark.parametrize("name", ["G6.12xlarge", "g6", "g6.12xlarge.big", "g6 12xlarge", ".xlarge"])
def test_what_is_no_instance_type(name):
    assert not INSTANCE_TYPE.fullmatch(name)


def test_config_and_the_capacity_survey_share_the_region_rule():
    """A region of the newest partition has the shape (the old pattern wanted two letters); the
    stack then refuses it for its partition, not for its name."""
    assert REGION.fullmatch("eusc-de-east-1")
    with pytest.raises(ConfigError, match=r"'aws:region' = 'eusc-de-east-1' is in the aws-eusc partition"):
        parse_settings({"endpointPublicAccessCidrs": '["203.0.113.7/32"]'}, "eusc-de-east-1", stack="dev")
    with pytest.raises(ConfigError, match=r"'aws:region' = 'us-east-2a': expected a region name"):
        parse_settings({}, "us-east-2a", stack="dev")


@pytest.mark.parametrize(
    "text, mib",
    [("160Gi", 163_840), ("512Mi", 512), ("1G", 953), ("1Ti", 2**20), ("1.5Gi", 1536), ("2e9", 1907)],
)
def test_memory_quantities_in_mib(text, mib):
    assert memory_mib(text) == mib
    assert mib == int(parse_quantity(text) / 2**20)  # the Kubernetes client's reading, rounded down


@pytest.mark.parametrize(
    "text", ["lots", "", "160 Gi", " 160Gi", "160gi", "-1Gi", "0", "100m", "1Ki", "NaN", "Inf"]
)
def test_what_is_no_memory_quantity(text):
    with pytest.raises(ValueError, match=r"is not a Kubernetes memory quantity such as 160Gi or 163840Mi"):
        memory_mib(text)


@pytest.mark.parametrize(
    "image, problem",
    [
        ("public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1", None),
        ("rayproject/ray:2.58.0-py311-gpu", None),
        ("localhost:5000/ray:2.58.0", None),
        ("rayproject/ray@sha256:" + "a" * 64, None),
        ("rayproject/ray:latest@sha256:" + "a" * 64, None),
        ("rayproject/ray", "has no tag (so it means latest)"),
        ("localhost:5000/ray", "has no tag (so it means latest)"),
        ("rayproject/ray:latest", "is tagged latest"),
        ("rayproject/ray@sha256:abc", "has a malformed digest"),
        ("rayproject/ray:latest@sha256:" + "a" * 63 + "g", "has a malformed digest"),
    ],
)
def test_image_pin_rule(image, problem):
    assert image_pin_problem(image) == problem


def test_project_is_the_pulumi_projects_name():
    assert yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["name"] == platform_contract.PROJECT


def test_gpu_scheduling_follows_the_node_labels_and_taint():
    contract = platform_contract
    assert contract.GPU_NODE_SELECTOR.items() <= contract.GPU_LABELS.items()
    assert contract.SYSTEM_NODE_SELECTOR.items() <= contract.SYSTEM_LABELS.items()
    assert contract.GPU_TOLERATION["key"] == contract.GPU_TAINT["key"] == contract.GPU_RESOURCE
    # EKS's NO_SCHEDULE is Kubernetes' NoSchedule (EKS API reference, Taint).
    assert (contract.GPU_TAINT["effect"], contract.GPU_TOLERATION["effect"]) == ("NO_SCHEDULE", "NoSchedule")
    assert set(contract.EXPECTABLE_TRANSPORTS) == set(contract.TRANSPORTS) - {"unknown"}


def test_the_contract_imports_with_the_standard_library_alone():
    """Nothing but the standard library at import (-S hides site-packages); the client only to read a quantity."""
    probe = "import sys; sys.path.insert(0, '.'); import platform_contract"
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    third_party = {
        name.split(".")[0]
        for name in imported_modules(ROOT / "platform_contract.py")
        if name.split(".")[0] not in sys.stdlib_module_names
    }
    assert third_party == {"kubernetes"}
