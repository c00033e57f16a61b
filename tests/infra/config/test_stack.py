"""Stack settings (`infra.config.stack`): defaults, parsing, and bad input that must fail naming the
key and the fix."""

from __future__ import annotations

import json

import pytest

from infra.config.stack import ConfigError
from tests.harness.stack_values import parse


def test_defaults_are_the_reference_setup():
    settings = parse()
    assert (settings.gpu_node_type, settings.gpu_node_count) == ("g6.12xlarge", 2)
    assert (settings.system_node_type, settings.system_node_count) == ("m7i.xlarge", 1)
    assert (settings.worker_cpu, settings.worker_memory) == (40, "160Gi")
    assert settings.kubernetes_version == "1.36"
    assert settings.image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert settings.ray_version == "2.58.0"
    assert settings.train and not settings.benchmark
    assert settings.training.expect_transport == "efa"


def test_values_arrive_as_engine_text():
    settings = parse(
        gpuNodeCount="3",
        train="false",
        training='{"steps": 7, "learningRate": 1e-4, "hsdpReplicas": "auto", "compile": "false"}',
    )
    assert settings.gpu_node_count == 3 and settings.train is False
    assert settings.training.flags == (
        *("--preset", "smoke", "--steps", "7", "--lr", "0.0001"),
        *("--hsdp-replicas", "auto", "--no-compile"),
    )


@pytest.mark.parametrize(
    "values, message",
    [
        ({"gpuNodeCount": "0"}, "'gpuNodeCount' = '0': must be at least 1"),
        ({"gpuNodeCount": "two"}, "'gpuNodeCount' = 'two': expected a whole number"),
        ({"gpuNodeType": "G6 12xlarge"}, "'gpuNodeType'"),
        ({"vpcCidr": "10.0.0.0/33"}, "'vpcCidr' = '10.0.0.0/33': not a CIDR block"),
        ({"vpcCidr": "10.0.0.0/8"}, "between /16 and /20"),
        ({"gpuAz": "us-west-2a"}, "'gpuAz' = 'us-west-2a' is not in region us-east-2"),
        ({"endpointPublicAccessCidrs": '["0.0.0.0/0"]'}, "opens the Kubernetes API to the whole internet"),
        ({"image": "rayproject/ray:latest"}, "pin the image"),
        ({"image": "rayproject/ray"}, "pin the image"),
        ({"capacityReservationId": "reservation-1"}, "'capacityReservationId'"),
        ({"workerMemory": "lots"}, "'workerMemory' = 'lots'"),
        (
            {"workerMemory": "160 Gi"},
            "'workerMemory' = '160 Gi': '160 Gi' is not a Kubernetes memory quantity",
        ),
        ({"workerMemory": "-1Gi"}, "'workerMemory' = '-1Gi': '-1Gi' is not a Kubernetes memory quantity"),
        ({"image": "rayproject/ray@sha256:abc"}, "pin the image"),
        ({"train": "yes"}, "'train' = 'yes': expected true or false"),
        (
            {"training": '{"preset": "fast"}'},
            "'training.preset' = 'fast': invalid choice: 'fast' (choose from 'smoke', 'throughput', 'tiny')",
        ),
        ({"training": '{"seqLen": 0}'}, "'training.seqLen' = 0: must be >= 1, got 0"),
        (
            {"training": '{"seqLen": "long"}'},
            "'training.seqLen' = 'long': expected a whole number >= 1, got 'long'",
        ),
        ({"training": '{"learningRate": -1}'}, "'training.learningRate' = -1: must be > 0, got -1"),
        ({"training": '{"compile": "yes"}'}, "'training.compile' = 'yes': expected true or false, got 'yes'"),
        ({"training": '{"steps": true}'}, "'training.steps' = True: expected a single value, got True"),
        ({"training": '{"steps": [1, 2]}'}, "'training.steps' = [1, 2]: expected a single value"),
        ({"training": '{"steps": null}'}, "'training.steps' = None: expected a single value"),
        (
            {"training": '{"workers": 6, "hsdpReplicas": 4}'},
            "config key 'training': 6 workers are not a multiple of hsdpReplicas 4",
        ),
        (
            {"training": '{"init": "random", "modelConfig": "tiny", "seqLen": 100000}'},
            "config key 'training': seqLen 100000 exceeds the model's max_position_embeddings",
        ),
        (
            {"training": '{"lr": 1e-4, "learningRate": 2e-4}'},
            "'training.lr' and 'training.learningRate' both set",
        ),
        (
            {"training": '{"modelId": "org/model $(date)"}'},
            "'training.modelId' = 'org/model $(date)': use letters, digits",
        ),
        ({"training": '{"data": "s3://b/my corpus"}'}, "passes through a shell on the cluster"),
        ({"training": '{"expectTransport": "tcp"}'}, "'training.expectTransport'"),
        ({"training": '{"minBusbwFraction": 1.5}'}, "'training.minBusbwFraction'"),
        ({"training": '{"minBusbwFraction": true}'}, "'training.minBusbwFraction'"),
        ({"training": "[1, 2]"}, "'training' must be an object"),
        ({"clusterName": "c" * 44}, f"'clusterName' = '{'c' * 44}': at most 43 characters"),
        ({"clusterName": "-leading-dash"}, "'clusterName'"),
        (
            {"adminPrincipalArns": '"arn:aws:iam::123456789012:role/ci"'},
            "expected a non-empty list of IAM ARNs",
        ),
        ({"adminPrincipalArns": "[]"}, "expected a non-empty list"),
        ({"adminPrincipalArns": '["ci-role"]'}, "'ci-role' is not the ARN of an IAM user or role"),
        (
            {"adminPrincipalArns": '["arn:aws:iam::123456789012:group/admins"]'},
            "not the ARN of an IAM user or role",
        ),
        (
            {"adminPrincipalArns": '["arn:aws:sts::123456789012:assumed-role/ci/run-1"]'},
            "give the role's own ARN, arn:aws:iam::123456789012:role/ci",
        ),
        (
            {
                "adminPrincipalArns": '["arn:aws:iam::123456789012:user/a", "arn:aws:iam::123456789012:user/a"]'
            },
            "arn:aws:iam::123456789012:user/a listed twice",
        ),
        (
            {"logRetentionDays": "31"},
            "'logRetentionDays' = '31': CloudWatch Logs keeps logs for one of 1, 3, 5",
        ),
        ({"logRetentionDays": "0"}, "'logRetentionDays' = '0': must be at least 1"),
        ({"logRetentionDays": "forever"}, "expected a whole number"),
        (
            {"gpuNodesAfterTraining": "scale-to-zero"},
            "'gpuNodesAfterTraining' = 'scale-to-zero': expected one of keep, release",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_fix(values, message):
    with pytest.raises(ConfigError) as raised:
        parse(**values)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "key, suggestion",
    [("gpuNodeCont", "gpuNodeCount"), ("clustername", "clusterName"), ("gpuAZ", "gpuAz")],
)
def test_misspelt_keys_get_the_closest_known_key(key, suggestion):
    with pytest.raises(ConfigError, match=f"unknown config key '{key}': did you mean '{suggestion}'"):
        parse(**{key: "1"})


def test_new_keys_defaults_and_values():
    settings = parse()
    assert settings.admin_principal_arns == () and settings.log_retention_days == 30
    assert parse(clusterName="c" * 43).cluster_name == "c" * 43
    admins = ["arn:aws:iam::123456789012:role/platform/ci", "arn:aws-us-gov:iam::123456789012:user/alice"]
    settings = parse(adminPrincipalArns=json.dumps(admins), logRetentionDays="365")
    assert settings.admin_principal_arns == tuple(admins) and settings.log_retention_days == 365
    assert settings.gpu_nodes_after_training == "keep"
    assert parse(gpuNodesAfterTraining="release").gpu_nodes_after_training == "release"


def test_repin_images_is_a_short_label_unset_by_default():
    """Issue 60: a value other than the one the stack recorded reads every image tag's digest anew."""
    assert parse().repin_images is None
    assert parse(repinImages="2026-12-06").repin_images == "2026-12-06"
    for bad in ("", "two words", "x" * 65, "-leading"):
        with pytest.raises(ConfigError, match=r"'repinImages' = .*: expected something like 2026-12-06"):
            parse(repinImages=bad)
