"""The policy pack: each rule on passing and failing properties, through pulumi-policy's own
argument types, and on every resource the program registers for each stack (all must pass)."""

from __future__ import annotations

import copy
import json
import runpy
import sys
from pathlib import Path

import pulumi_policy
import pytest
from kubernetes.utils import parse_quantity
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    unknown_checking_proxy,
)

import platform_facts
from infra.resources.cluster import control_plane_log_group
from infra.resources.node_groups import METADATA_OPTIONS
from policy import rules
from policy.rules import StackResource
from tests.harness.paths import REPO_ROOT
from tests.harness.program import STACK_FILES, USER_SETTINGS, Plan, run_program, stack_config
from workloads import efa_counter_reader, manifests

POLICY_DIR = REPO_ROOT / "policy"
UNKNOWN = UNKNOWN_STRING_VALUE
DEFINED_RULES = [
    value for value in vars(rules).values() if isinstance(value, (rules.ResourceRule, rules.StackRule))
]
RESOURCE_RULES = [rule for rule in DEFINED_RULES if isinstance(rule, rules.ResourceRule)]
STACK_RULES = [rule for rule in DEFINED_RULES if isinstance(rule, rules.StackRule)]

LT = rules.LAUNCH_TEMPLATE
NG = rules.NODE_GROUP
EKS = rules.PULUMI_EKS_CLUSTER
AWS_EKS = rules.AWS_EKS_CLUSTER
SVC = rules.SERVICE
RAY = "kubernetes:ray.io/v1:RayCluster"
ALL_LOGS = list(rules.CONTROL_PLANE_LOG_TYPES)
NS = rules.NAMESPACE


def efa_template(**overrides) -> dict:
    """A GPU launch template's inputs as the engine shows them (nested booleans as strings)."""
    props = {
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            "httpPutResponseHopLimit": 1,
        },
        "networkInterfaces": [
            {
                "networkCardIndex": 0,
                "deviceIndex": 0,
                "interfaceType": "efa",
                "associatePublicIpAddress": "false",
            }
        ],
    }
    props.update(overrides)
    return props


def worker_container(requests: dict | None, limits: dict | None, image: str = "repo/ray:2.58.0") -> dict:
    resources = {
        key: value for key, value in (("requests", requests), ("limits", limits)) if value is not None
    }
    return {"name": "ray-worker", "image": image, "resources": resources}


def ray_cluster(worker: dict, service_type: str = "ClusterIP", head_image: str = "repo/ray:2.58.0") -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "ray-train"},
        "spec": {
            "headGroupSpec": {
                "serviceType": service_type,
                "template": {"spec": {"containers": [{"name": "ray-head", "image": head_image}]}},
            },
            "workerGroupSpecs": [
                {"groupName": "gpu-workers", "template": {"spec": {"containers": [worker]}}}
            ],
        },
    }


GUARANTEED = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # nodes-without-public-ips
    (rules.NODES_WITHOUT_PUBLIC_IPS, LT, efa_template(), "dev", None),
    (rules.NODES_WITHOUT_PUBLIC_IPS, LT, {"metadataOptions": {"httpTokens": "required"}}, "dev", None),
    (
        rules.NODES_WITHOUT_PUBLIC_IPS,
        LT,
        efa_template(networkInterfaces=[{"associatePublicIpAddress": UNKNOWN}]),
        "dev",
        None,
    ),
    (rules.NODES_WITHOUT_PUBLIC_IPS, LT, efa_template(networkInterfaces=UNKNOWN_ARRAY_VALUE), "dev", None),
    (rules.NODES_WITHOUT_PUBLIC_IPS, "aws:ec2/subnet:Subnet", {"mapPublicIpOnLaunch": False}, "dev", None),
    (rules.NODES_WITHOUT_PUBLIC_IPS, "aws:ec2/subnet:Subnet", {"cidrBlock": "10.0.0.0/18"}, "dev", None),
    (rules.NODES_WITHOUT_PUBLIC_IPS, EKS, {"nodeAssociatePublicIpAddress": False}, "dev", None),
    (
        rules.NODES_WITHOUT_PUBLIC_IPS,
        LT,
        efa_template(networkInterfaces=[{"associatePublicIpAddress": "true"}]),
        "dev",
        "networkInterfaces[0].associatePublicIpAddress",
    ),
    (
        rules.NODES_WITHOUT_PUBLIC_IPS,
        LT,
        efa_template(networkInterfaces=[{}, {"associatePublicIpAddress": True}]),
        "dev",
        "networkInterfaces[1]",
    ),
    (
        rules.NODES_WITHOUT_PUBLIC_IPS,
        "aws:ec2/subnet:Subnet",
        {"mapPublicIpOnLaunch": True},
        "dev",
        "mapPublicIpOnLaunch",
    ),
    (
        rules.NODES_WITHOUT_PUBLIC_IPS,
        "eks:index:NodeGroupV2",
        {"nodeAssociatePublicIpAddress": True},
        "dev",
        "nodeAssociatePublicIpAddress",
    ),
    # imdsv2-required
    (rules.IMDSV2_REQUIRED, LT, efa_template(), "dev", None),
    (rules.IMDSV2_REQUIRED, LT, {"metadataOptions": {"httpEndpoint": "disabled"}}, "dev", None),
    (rules.IMDSV2_REQUIRED, LT, {"metadataOptions": {"httpTokens": UNKNOWN}}, "dev", None),
    (rules.IMDSV2_REQUIRED, LT, {"metadataOptions": UNKNOWN_OBJECT_VALUE}, "dev", None),
    (rules.IMDSV2_REQUIRED, NG, {"launchTemplate": {"id": UNKNOWN, "version": UNKNOWN}}, "dev", None),
    (
        rules.IMDSV2_REQUIRED,
        LT,
        {"metadataOptions": {"httpTokens": "optional"}},
        "dev",
        "httpTokens is 'optional'",
    ),
    (rules.IMDSV2_REQUIRED, LT, {"description": "no metadata options"}, "dev", "httpTokens is not set"),
    (rules.IMDSV2_REQUIRED, NG, {"subnetIds": ["subnet-1"]}, "dev", "no launch template"),
    # metadata-hop-limit-1
    (rules.METADATA_HOP_LIMIT, LT, efa_template(), "dev", None),
    # Numbers reach a policy as floats (JSON through protobuf).
    (rules.METADATA_HOP_LIMIT, LT, {"metadataOptions": {"httpPutResponseHopLimit": 1.0}}, "dev", None),
    (rules.METADATA_HOP_LIMIT, LT, {"metadataOptions": {"httpEndpoint": "disabled"}}, "dev", None),
    (rules.METADATA_HOP_LIMIT, LT, {"metadataOptions": UNKNOWN_OBJECT_VALUE}, "dev", None),
    (
        rules.METADATA_HOP_LIMIT,
        LT,
        {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2.0}},
        "dev",
        "httpPutResponseHopLimit is 2.0",
    ),
    (
        rules.METADATA_HOP_LIMIT,
        LT,
        {"metadataOptions": {"httpTokens": "required"}},
        "dev",
        "httpPutResponseHopLimit is not set",
    ),
    # eks-secrets-kms-encrypted
    (
        rules.EKS_SECRETS_ENCRYPTED,
        EKS,
        {"encryptionConfigKeyArn": "arn:aws:kms:us-east-2:1:key/k"},
        "dev",
        None,
    ),
    (rules.EKS_SECRETS_ENCRYPTED, EKS, {"encryptionConfigKeyArn": UNKNOWN}, "dev", None),
    (
        rules.EKS_SECRETS_ENCRYPTED,
        AWS_EKS,
        {"encryptionConfig": {"provider": {"keyArn": UNKNOWN}, "resources": ["secrets"]}},
        "dev",
        None,
    ),
    (rules.EKS_SECRETS_ENCRYPTED, EKS, {"name": "c"}, "dev", "encryptionConfigKeyArn"),
    (rules.EKS_SECRETS_ENCRYPTED, AWS_EKS, {"name": "c"}, "dev", "encryptionConfig"),
    (
        rules.EKS_SECRETS_ENCRYPTED,
        AWS_EKS,
        {"encryptionConfig": {"provider": {"keyArn": "arn:k"}, "resources": []}},
        "dev",
        "['secrets']",
    ),
    # eks-api-not-open-to-internet
    (
        rules.EKS_API_NOT_OPEN,
        EKS,
        {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.7/32"]},
        "dev",
        None,
    ),
    (rules.EKS_API_NOT_OPEN, EKS, {"publicAccessCidrs": ["0.0.0.0/1", "198.51.100.0/24"]}, "dev", None),
    (rules.EKS_API_NOT_OPEN, EKS, {"endpointPublicAccess": False}, "dev", None),
    (
        rules.EKS_API_NOT_OPEN,
        EKS,
        {"endpointPublicAccess": True, "publicAccessCidrs": UNKNOWN_ARRAY_VALUE},
        "dev",
        None,
    ),
    (rules.EKS_API_NOT_OPEN, AWS_EKS, {"vpcConfig": {"endpointPublicAccess": "false"}}, "dev", None),
    (rules.EKS_API_NOT_OPEN, EKS, {"endpointPublicAccess": True}, "dev", "publicAccessCidrs is empty"),
    (rules.EKS_API_NOT_OPEN, EKS, {"name": "public by default"}, "dev", "publicAccessCidrs is empty"),
    (
        rules.EKS_API_NOT_OPEN,
        EKS,
        {"publicAccessCidrs": ["203.0.113.7/32", "0.0.0.0/0"]},
        "dev",
        "cover 0.0.0.0/0",
    ),
    (
        rules.EKS_API_NOT_OPEN,
        EKS,
        {"publicAccessCidrs": ["0.0.0.0/1", UNKNOWN, "128.0.0.0/1"]},
        "dev",
        "cover 0.0.0.0/0",
    ),
    (rules.EKS_API_NOT_OPEN, EKS, {"publicAccessCidrs": ["2001:db8::/32", "::/0"]}, "dev", "cover ::/0"),
    (
        rules.EKS_API_NOT_OPEN,
        AWS_EKS,
        {"vpcConfig": {"publicAccessCidrs": ["0.0.0.0/0"]}},
        "dev",
        "vpcConfig.publicAccessCidrs cover 0.0.0.0/0",
    ),
    # gpu-node-group-single-subnet
    (
        rules.GPU_NODE_GROUP_SINGLE_SUBNET,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": ["subnet-a"]},
        "dev",
        None,
    ),
    (
        rules.GPU_NODE_GROUP_SINGLE_SUBNET,
        NG,
        {"labels": {"role": "system"}, "subnetIds": ["a", "b"]},
        "dev",
        None,
    ),
    (
        rules.GPU_NODE_GROUP_SINGLE_SUBNET,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": UNKNOWN_ARRAY_VALUE},
        "dev",
        None,
    ),
    (
        rules.GPU_NODE_GROUP_SINGLE_SUBNET,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": ["a", UNKNOWN]},
        "dev",
        "has 2 subnets",
    ),
    (
        rules.GPU_NODE_GROUP_SINGLE_SUBNET,
        NG,
        {"amiType": "AL2023_x86_64_NVIDIA", "subnetIds": ["a", "b"]},
        "dev",
        "has 2 subnets",
    ),
    # ray-ports-not-exposed
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        SVC,
        {"spec": {"type": "ClusterIP", "ports": [{"port": 8265}]}},
        "dev",
        None,
    ),
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        SVC,
        {"spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}},
        "dev",
        None,
    ),
    (rules.RAY_PORTS_NOT_EXPOSED, SVC, {"spec": {"ports": [{"port": 6379}]}}, "dev", None),
    (rules.RAY_PORTS_NOT_EXPOSED, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    # Numbers reach policies as floats (JSON through protobuf).
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        SVC,
        {"spec": {"type": "LoadBalancer", "ports": [{"port": 8265.0}]}},
        "dev",
        "Ray port(s) 8265 outside",
    ),
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        SVC,
        {
            "spec": {
                "type": "NodePort",
                "ports": [{"port": 80, "targetPort": "dashboard"}, {"port": 1, "targetPort": "10001"}],
            }
        },
        "dev",
        "Ray port(s) 10001, dashboard",
    ),
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED), "LoadBalancer"),
        "dev",
        "headGroupSpec.serviceType is LoadBalancer",
    ),
    (
        rules.RAY_PORTS_NOT_EXPOSED,
        "kubernetes:ray.io/v1:RayJob",
        {"spec": {"rayClusterSpec": {"headGroupSpec": {"headService": {"spec": {"type": "NodePort"}}}}}},
        "dev",
        "headService.spec.type is NodePort",
    ),
    # ray-worker-requests-equal-limits
    (rules.RAY_WORKERS_GUARANTEED, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    (rules.RAY_WORKERS_GUARANTEED, RAY, ray_cluster(worker_container(None, GUARANTEED)), "dev", None),
    (
        rules.RAY_WORKERS_GUARANTEED,
        RAY,
        ray_cluster(
            worker_container({"cpu": 40, "memory": "163840Mi"}, {"cpu": "40000m", "memory": "160Gi"})
        ),
        "dev",
        None,
    ),
    (
        rules.RAY_WORKERS_GUARANTEED,
        RAY,
        ray_cluster(worker_container({**GUARANTEED, "cpu": UNKNOWN}, GUARANTEED)),
        "dev",
        None,
    ),
    (
        rules.RAY_WORKERS_GUARANTEED,
        RAY,
        ray_cluster(worker_container({**GUARANTEED, "cpu": "36"}, GUARANTEED)),
        "dev",
        "worker group gpu-workers, container ray-worker: cpu request 36 != limit 40",
    ),
    (
        rules.RAY_WORKERS_GUARANTEED,
        RAY,
        ray_cluster(
            worker_container(GUARANTEED, {k: v for k, v in GUARANTEED.items() if k != "nvidia.com/gpu"})
        ),
        "dev",
        "nvidia.com/gpu requested (4) without a limit",
    ),
    (
        rules.RAY_WORKERS_GUARANTEED,
        RAY,
        ray_cluster(worker_container(GUARANTEED, None)),
        "dev",
        "no cpu limit",
    ),
    # container-images-pinned
    (rules.CONTAINER_IMAGES_PINNED, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    (
        rules.CONTAINER_IMAGES_PINNED,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED, image="repo/ray@sha256:" + "a" * 64)),
        "dev",
        None,
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": "localhost:5000/ray:2.58.0"}]}},
        "dev",
        None,
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": UNKNOWN}]}},
        "dev",
        None,
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED), head_image="repo/ray:latest"),
        "dev",
        "container ray-head: image repo/ray:latest is tagged latest",
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED, image="localhost:5000/ray")),
        "dev",
        "container ray-worker: image localhost:5000/ray has no tag",
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        "kubernetes:apps/v1:Deployment",
        {
            "spec": {
                "template": {
                    "spec": {"initContainers": [{"name": "init", "image": "busybox"}], "containers": []}
                }
            }
        },
        "dev",
        "container init: image busybox has no tag",
    ),
    (
        rules.CONTAINER_IMAGES_PINNED,
        "kubernetes:batch/v1:CronJob",
        {
            "spec": {
                "jobTemplate": {
                    "spec": {"template": {"spec": {"containers": [{"name": "j", "image": "a/b:latest"}]}}}
                }
            }
        },
        "dev",
        "container j",
    ),
    # eks-control-plane-logging (advisory)
    (rules.CONTROL_PLANE_LOGGING, EKS, {"enabledClusterLogTypes": ALL_LOGS}, "dev", None),
    (rules.CONTROL_PLANE_LOGGING, AWS_EKS, {"enabledClusterLogTypes": UNKNOWN_ARRAY_VALUE}, "dev", None),
    (
        rules.CONTROL_PLANE_LOGGING,
        EKS,
        {"enabledClusterLogTypes": ["api", "authenticator"]},
        "dev",
        "audit, controllerManager, scheduler",
    ),
    (rules.CONTROL_PLANE_LOGGING, AWS_EKS, {"name": "c"}, "dev", "api, audit"),
    # eks-deletion-protection (advisory)
    (rules.DELETION_PROTECTION, EKS, {"name": "c"}, "dev", None),
    (rules.DELETION_PROTECTION, EKS, {"name": "c"}, "team-dev", None),
    (rules.DELETION_PROTECTION, EKS, {"deletionProtection": True}, "us-east-1", None),
    (rules.DELETION_PROTECTION, EKS, {"name": "c"}, "us-east-1", "stack us-east-1 is not a dev stack"),
    (rules.DELETION_PROTECTION, AWS_EKS, {"deletionProtection": False}, "prod", "deletionProtection"),
    # log-groups-kms-encrypted (advisory)
    (
        rules.LOG_GROUPS_KMS_ENCRYPTED,
        rules.LOG_GROUP,
        {"kmsKeyId": "arn:aws:kms:us-east-2:1:key/k"},
        "dev",
        None,
    ),
    (rules.LOG_GROUPS_KMS_ENCRYPTED, rules.LOG_GROUP, {"kmsKeyId": UNKNOWN}, "dev", None),
    (rules.LOG_GROUPS_KMS_ENCRYPTED, rules.LOG_GROUP, {"retentionInDays": 30}, "dev", "no kmsKeyId"),
]


@pytest.mark.parametrize(
    "rule, resource_type, props, stack, expected",
    CASES,
    ids=[f"{case[0].name}-{'fails' if case[4] else 'passes'}-{index}" for index, case in enumerate(CASES)],
)
def test_resource_rule(rule, resource_type, props, stack, expected):
    violations = rule.check(resource_type, props, stack)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0], violations


def test_every_resource_rule_has_passing_and_failing_cases():
    for rule in RESOURCE_RULES:
        outcomes = {case[4] is None for case in CASES if case[0] is rule}
        assert outcomes == {True, False}, f"{rule.name} lacks a passing or a failing case"


def test_rules_ignore_resources_they_are_not_about():
    unrelated = {"spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}, "mapPublicIpOnLaunch": True}
    for rule in RESOURCE_RULES:
        assert rule.check("aws:s3/bucket:Bucket", unrelated, "prod") == [], rule.name


# --- the stack rule: the GPU node group's launch template has an EFA interface -------------------


def gpu_group(dependencies: tuple[str, ...] = ("urn:lt-gpu",), **props) -> StackResource:
    base = {
        "labels": {"role": "gpu-worker"},
        "launchTemplate": {"id": UNKNOWN, "version": UNKNOWN},
        "subnetIds": ["a"],
    }
    return StackResource(NG, "urn:ng-gpu", {**base, **props}, dependencies)


def template(urn: str, **props) -> StackResource:
    return StackResource(LT, urn, efa_template(**props), ())


ENA_ONLY = [{"deviceIndex": 0, "associatePublicIpAddress": "false"}]
SYSTEM_GROUP = StackResource(
    NG, "urn:ng-system", {"labels": {"role": "system"}, "launchTemplate": {"id": "x"}}, ()
)


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([template("urn:lt-gpu"), gpu_group(), SYSTEM_GROUP], None),
        ([template("urn:lt-gpu", networkInterfaces=UNKNOWN_ARRAY_VALUE), gpu_group()], None),
        # Known ids (an update's preview) link the group to its template without a dependency.
        (
            [template("urn:lt-gpu", id="lt-1"), gpu_group((), launchTemplate={"id": "lt-1", "version": "1"})],
            None,
        ),
        (
            [template("urn:lt-gpu", networkInterfaces=ENA_ONLY), gpu_group()],
            "no network interface with interfaceType 'efa'",
        ),
        (
            [
                template("urn:lt-gpu", networkInterfaces=ENA_ONLY),
                template("urn:lt-other"),
                gpu_group((), launchTemplate={"id": "lt-1"}),
            ],
            "not in this stack",
        ),
        (
            [
                template("urn:lt-gpu", id="lt-1", networkInterfaces=ENA_ONLY),
                template("urn:lt-other", id="lt-2"),
                gpu_group(("urn:lt-other",), launchTemplate={"id": "lt-1"}),
            ],
            "no network interface with interfaceType 'efa'",
        ),
        (
            [StackResource(NG, "urn:ng-gpu", {"amiType": "AL2023_x86_64_NVIDIA", "subnetIds": ["a"]}, ())],
            "has no launch template",
        ),
    ],
)
def test_gpu_node_group_efa(resources, expected):
    violations = rules.check_gpu_node_group_efa(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:ng-gpu" and expected in violations[0][1], (
            violations
        )


# --- stack rules: TLS-only buckets, log retention -------------------------------------------------

BUCKET = "aws:s3/bucket:Bucket"
ARN = "arn:aws:s3:::ckpt"
TLS_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [ARN, f"{ARN}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    ],
}


def bucket_policy(document, dependencies=("urn:bucket",), **props) -> StackResource:
    policy = document if isinstance(document, str) else json.dumps(document)
    return StackResource(
        rules.BUCKET_POLICY, "urn:policy", {"bucket": UNKNOWN, "policy": policy, **props}, dependencies
    )


def tls_statement(**changes) -> dict:
    return {**TLS_ONLY, "Statement": [{**TLS_ONLY["Statement"][0], **changes}]}


CKPT_BUCKET = StackResource(BUCKET, "urn:bucket", {"bucket": "ckpt"}, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY)], None),
        ([CKPT_BUCKET, bucket_policy(UNKNOWN)], None),
        # An update's preview: linked by the known bucket name.
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY, dependencies=(), bucket="ckpt")], None),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Action=["s3:GetObject", "*"]))], None),
        ([CKPT_BUCKET], "has no bucket policy"),
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY, dependencies=("urn:other",))], "has no bucket policy"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Effect="Allow"))], "does not deny plain HTTP"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Resource=[ARN]))], "does not deny plain HTTP"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Action="s3:GetObject"))], "does not deny plain HTTP"),
        (
            [CKPT_BUCKET, bucket_policy(tls_statement(Condition={"Bool": {"aws:SecureTransport": "true"}}))],
            "does not deny plain HTTP",
        ),
    ],
)
def test_buckets_tls_only(resources, expected):
    violations = rules.check_buckets_tls_only(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1]


def log_group(name="/aws/eks/c/cluster", **props) -> StackResource:
    return StackResource(rules.LOG_GROUP, f"urn:lg-{name}", {"name": name, **props}, ())


LOGGING_CLUSTER = StackResource(EKS, "urn:eks", {"name": "c", "enabledClusterLogTypes": ALL_LOGS}, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([LOGGING_CLUSTER, log_group(retentionInDays=30.0)], None),
        ([LOGGING_CLUSTER, log_group(retentionInDays=UNKNOWN)], None),
        ([StackResource(EKS, "urn:eks", {"name": "c"}, ())], None),
        ([StackResource(AWS_EKS, "urn:eks", {"name": UNKNOWN, "enabledClusterLogTypes": ["api"]}, ())], None),
        ([LOGGING_CLUSTER, log_group()], "no retentionInDays"),
        ([LOGGING_CLUSTER, log_group(retentionInDays=0)], "no retentionInDays"),
        ([LOGGING_CLUSTER, log_group("/aws/eks/other/cluster", retentionInDays=7)], "/aws/eks/c/cluster"),
        ([LOGGING_CLUSTER], "which is not in the stack"),
    ],
)
def test_log_retention(resources, expected):
    violations = rules.check_log_retention(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations


VERSIONING = rules.BUCKET_VERSIONING[0]


@pytest.mark.parametrize(
    "resources, expected",
    [
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": "Enabled"}}, ("urn:bucket",)
                ),
            ],
            None,
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING,
                    "urn:v",
                    {"bucket": "ckpt", "versioningConfiguration": {"status": "Enabled"}},
                    (),
                ),
            ],
            None,
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": UNKNOWN}}, ("urn:bucket",)
                ),
            ],
            None,
        ),
        ([StackResource(BUCKET, "urn:bucket", {"versioning": {"enabled": "true"}}, ())], None),
        ([CKPT_BUCKET], "does not keep versions"),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": "Suspended"}}, ("urn:bucket",)
                ),
            ],
            "does not keep versions",
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING,
                    "urn:v",
                    {"bucket": "other", "versioningConfiguration": {"status": "Enabled"}},
                    (),
                ),
            ],
            "does not keep versions",
        ),
    ],
)
def test_buckets_versioned(resources, expected):
    violations = rules.check_buckets_versioned(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1]


VPC_ = StackResource(rules.VPC, "urn:vpc", {"cidrBlock": "10.0.0.0/16"}, ())


def default_group(**props) -> StackResource:
    return StackResource(rules.DEFAULT_SECURITY_GROUP, "urn:dsg", {"vpcId": "vpc-1", **props}, ("urn:vpc",))


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([VPC_, default_group()], None),
        ([VPC_, default_group(ingress=[], egress=[])], None),
        ([VPC_], "keeps AWS's rules"),
        ([VPC_, default_group(egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}])], "has egress rules"),
        ([VPC_, default_group(ingress=[{"protocol": "-1", "self": True}])], "has ingress rules"),
    ],
)
def test_default_security_group_closed(resources, expected):
    violations = rules.check_default_security_group_closed(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations


RAY_CR = StackResource(RAY, "urn:ray", {"metadata": {"name": "ray-train", "namespace": "ray-train"}}, ())


def network_policy(namespace_name="ray-train", **spec) -> StackResource:
    body = manifests.head_network_policy("ray-train", namespace_name)
    body["spec"].update(spec)
    return StackResource(rules.NETWORK_POLICY, "urn:np", body, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([RAY_CR, network_policy()], None),
        ([RAY_CR, network_policy(podSelector={"matchLabels": {"ray.io/cluster": "ray-train"}})], None),
        ([RAY_CR, network_policy(podSelector={})], None),
        ([RAY_CR, network_policy(policyTypes=UNKNOWN_ARRAY_VALUE)], None),
        ([RAY_CR], "no NetworkPolicy in namespace ray-train"),
        ([RAY_CR, network_policy("default")], "no NetworkPolicy"),
        ([RAY_CR, network_policy(policyTypes=["Egress"])], "no NetworkPolicy"),
        ([RAY_CR, network_policy(ingress=[{}])], "no NetworkPolicy"),
        (
            [RAY_CR, network_policy(podSelector={"matchLabels": {"ray.io/node-type": "worker"}})],
            "no NetworkPolicy",
        ),
    ],
)
def test_ray_head_network_policy(resources, expected):
    violations = rules.check_ray_head_network_policy(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:ray" and expected in violations[0][1], (
            violations
        )


# --- through pulumi-policy: unknown-checking proxies, stack name from the URN, reported URNs -------


def run_resource_policy(
    rule, resource_type: str, props: dict, stack: str = "dev"
) -> list[tuple[str, str | None]]:
    reported: list[tuple[str, str | None]] = []
    urn = f"urn:pulumi:{stack}::eks-ray-train::{resource_type}::r"
    options = PolicyResourceOptions(False, [], None, [], None, [], None)
    args = ResourceValidationArgs(resource_type, unknown_checking_proxy(props), urn, "r", options, None)
    rule.to_policy().validate(args, lambda message, urn=None: reported.append((message, urn)))
    return reported


def test_resource_policy_reads_unknowns_without_raising():
    props = {"metadataOptions": {"httpEndpoint": "enabled", "httpTokens": UNKNOWN}}
    assert run_resource_policy(rules.IMDSV2_REQUIRED, LT, props) == []


def test_resource_policy_reports_each_violation():
    props = efa_template(
        networkInterfaces=[{"associatePublicIpAddress": "true"}, {"associatePublicIpAddress": True}]
    )
    assert len(run_resource_policy(rules.NODES_WITHOUT_PUBLIC_IPS, LT, props)) == 2


def test_resource_policy_takes_the_stack_from_the_urn():
    assert run_resource_policy(rules.DELETION_PROTECTION, EKS, {"name": "c"}, stack="dev") == []
    assert run_resource_policy(rules.DELETION_PROTECTION, EKS, {"name": "c"}, stack="prod")


def test_stack_policy_links_by_dependency_and_reports_the_group():
    options = PolicyResourceOptions(False, [], None, [], None, [], None)

    def resource(type_: str, urn: str, props: dict, dependencies: list[PolicyResource]) -> PolicyResource:
        return PolicyResource(
            type_,
            unknown_checking_proxy(props),
            urn,
            urn,
            options,
            None,
            None,
            [],
            {"launchTemplate": dependencies},
        )

    ena_template = resource(LT, "urn:lt-gpu", efa_template(networkInterfaces=ENA_ONLY), [])
    group = resource(NG, "urn:ng-gpu", gpu_group().props, [ena_template])
    reported: list[tuple[str, str | None]] = []
    rules.GPU_NODE_GROUP_EFA.to_policy().validate(
        StackValidationArgs([ena_template, group]), lambda message, urn=None: reported.append((message, urn))
    )
    assert [urn for _, urn in reported] == ["urn:ng-gpu"]


# --- the pack's entry point -----------------------------------------------------------------------


def test_entry_point_lists_every_rule_with_its_enforcement(monkeypatch):
    packs = []

    def record_pack(name, policies, **_):
        packs.append((name, policies))

    monkeypatch.setattr(pulumi_policy, "PolicyPack", record_pack)
    had_rules = "rules" in sys.modules
    try:
        runpy.run_path(str(POLICY_DIR), run_name="__main__")  # as Pulumi runs the pack: the directory
    finally:
        if not had_rules:
            sys.modules.pop("rules", None)
    [(name, policies)] = packs
    assert name == "eks-ray-train"
    listed = {policy.name: policy.enforcement_level for policy in policies}
    assert listed == {rule.name: rule.enforcement for rule in DEFINED_RULES}
    assert len(listed) == len(policies)
    assert {rule.name for rule in DEFINED_RULES if rule.enforcement is EnforcementLevel.ADVISORY} == {
        "eks-control-plane-logging",
        "eks-deletion-protection",
        "log-groups-kms-encrypted",
    }


def test_pack_constants_match_the_program():
    assert rules.RAY_PORTS == platform_facts.RAY_PORTS
    assert rules.RAY_CLUSTER_LABEL == manifests.RAY_CLUSTER_LABEL
    assert rules.RAY_NODE_TYPE_LABEL == manifests.RAY_NODE_TYPE_LABEL
    assert manifests.POD_SECURITY_LABELS[rules.POD_SECURITY_ENFORCE] in rules.ENFORCED_LEVELS
    assert METADATA_OPTIONS["http_put_response_hop_limit"] == rules.POD_SAFE_HOP_LIMIT
    assert rules.control_plane_log_group("c") == control_plane_log_group("c")
    key, value = rules.GPU_NODE_LABEL
    assert platform_facts.GPU_LABELS[key] == value
    assert {key: value} == platform_facts.GPU_NODE_SELECTOR


@pytest.mark.parametrize(
    "image",
    [
        "rayproject/ray:2.58.0",
        "rayproject/ray",
        "rayproject/ray:latest",
        "localhost:5000/ray",
        "localhost:5000/ray:2.58.0",
        "repo/ray@sha256:" + "0" * 64,
        "repo/ray:latest@sha256:" + "0" * 64,
        "repo/ray@sha256:abc",
        "repo/ray@",
    ],
)
def test_pack_image_rule_is_the_programs(image):
    assert rules.image_pin_problem(image) == platform_facts.image_pin_problem(image)


@pytest.mark.parametrize(
    "text",
    ["40", "1Gi", "1024Mi", "160Gi", "100m", "1.5", "0.5Gi", "2k", "3M", "1e3", "1Ei", "7n", "40 ", "+2"],
)
def test_pack_reads_quantities_as_the_kubernetes_client_does(text):
    """The pack's own parser (its virtualenv has no kubernetes client) against `parse_quantity`."""
    assert rules._quantity(text) == parse_quantity(text)


# --- every resource of every stack's mocks run ------------------------------------------------------


def stack_name(stack_file: Path) -> str:
    return stack_file.name.removeprefix("Pulumi.").removesuffix(".yaml")


@pytest.fixture(scope="module", params=STACK_FILES, ids=stack_name)
def stack_plan(request) -> tuple[str, Plan]:
    stack = stack_name(request.param)
    return stack, run_program({**stack_config(request.param), **USER_SETTINGS}, stack=stack)


def stack_resources(plan: Plan) -> list[StackResource]:
    return [StackResource(r.type, r.urn, r.inputs, tuple(r.dependencies)) for r in plan.resources]


def mandatory_violations(plan: Plan, stack: str) -> list[str]:
    found = [
        f"{rule.name} on {r.type} {r.name}: {message}"
        for rule in RESOURCE_RULES
        if rule.enforcement is EnforcementLevel.MANDATORY
        for r in plan.resources
        for message in rule.check(r.type, r.inputs, stack)
    ]
    found += [
        f"{rule.name} on {urn}: {message}"
        for rule in STACK_RULES
        if rule.enforcement is EnforcementLevel.MANDATORY
        for urn, message in rule.check(stack_resources(plan))
    ]
    return found


# --- namespace-pod-security-enforced: a stack rule (a host-network namespace is judged by its pods) ----


def ns_resource(name: str, labels) -> StackResource:
    return StackResource(NS, f"urn:ns-{name}", {"metadata": {"name": name, "labels": labels}}, ())


HOST_NETWORK_LABELS = {
    rules.POD_SECURITY_ENFORCE: "privileged",
    rules.POD_SECURITY_WARN: "baseline",
    rules.POD_SECURITY_AUDIT: "baseline",
}


def node_agent(namespace_name: str = "agents", **pod) -> StackResource:
    """A DaemonSet whose pods need the host's network namespace and nothing else."""
    spec = {
        "hostNetwork": True,
        "containers": [
            {"name": "reader", "image": "repo/ray:2.58.0", "securityContext": {"privileged": False}}
        ],
        **pod,
    }
    props = {"metadata": {"name": "agent", "namespace": namespace_name}, "spec": {"template": {"spec": spec}}}
    return StackResource("kubernetes:apps/v1:DaemonSet", "urn:ds", props, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([ns_resource("ray-train", {rules.POD_SECURITY_ENFORCE: "baseline"})], None),
        ([ns_resource("ray-train", {rules.POD_SECURITY_ENFORCE: "restricted"})], None),
        ([ns_resource("ray-train", UNKNOWN_OBJECT_VALUE)], None),
        ([ns_resource("ray-train", {rules.POD_SECURITY_WARN: "restricted"})], "is not set"),
        ([StackResource(NS, "urn:ns", {"metadata": {"name": "n"}}, ())], "is not set"),
        # privileged: only for host-network pods alone, warned and audited at baseline
        ([ns_resource("agents", HOST_NETWORK_LABELS), node_agent()], None),
        ([ns_resource("agents", {rules.POD_SECURITY_ENFORCE: "privileged"})], "it warns at baseline"),
        (
            [ns_resource("agents", HOST_NETWORK_LABELS)],
            "the stack puts host-network pods in it (it puts none)",
        ),
        ([ns_resource("agents", HOST_NETWORK_LABELS), node_agent(hostNetwork=False)], "one does not"),
        ([ns_resource("agents", HOST_NETWORK_LABELS), node_agent(hostPID=True)], "hostPID: true"),
        (
            [
                ns_resource("agents", HOST_NETWORK_LABELS),
                node_agent(volumes=[{"name": "sys", "hostPath": {"path": "/sys"}}]),
            ],
            "volume sys is a hostPath",
        ),
        (
            [
                ns_resource("agents", HOST_NETWORK_LABELS),
                node_agent(containers=[{"name": "c", "securityContext": {"privileged": True}}]),
            ],
            "container c is privileged",
        ),
        (
            [
                ns_resource("agents", HOST_NETWORK_LABELS),
                node_agent(
                    containers=[{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]
                ),
            ],
            "container c adds capabilities",
        ),
        (
            [
                ns_resource("agents", HOST_NETWORK_LABELS),
                node_agent(containers=[{"name": "c", "ports": [{"hostPort": 22}]}]),
            ],
            "container c takes a host port",
        ),
        # A pod of another namespace does not make a privileged one acceptable.
        ([ns_resource("agents", HOST_NETWORK_LABELS), node_agent("elsewhere")], "it puts none"),
    ],
)
def test_namespace_pod_security(resources, expected):
    violations = rules.check_namespace_pod_security(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
        assert violations[0][0] == resources[0].urn


def test_the_efa_counter_readers_namespace_is_one_for_host_network_pods_alone():
    """The program's own reader namespace and DaemonSet, as the rule sees them."""
    resources = [
        StackResource(NS, "urn:ns", efa_counter_reader.reader_namespace(), ()),
        StackResource(
            "kubernetes:apps/v1:DaemonSet",
            "urn:ds",
            efa_counter_reader.reader_daemonset("repo/ray:2.58.0"),
            (),
        ),
    ]
    assert rules.check_namespace_pod_security(resources) == []


def test_every_stack_passes_every_mandatory_rule(stack_plan):
    stack, plan = stack_plan
    assert mandatory_violations(plan, stack) == []


def test_every_stack_sends_all_control_plane_logs(stack_plan):
    stack, plan = stack_plan
    cluster = plan.one(EKS)
    assert rules.CONTROL_PLANE_LOGGING.check(cluster.type, cluster.inputs, stack) == []
    group = plan.one(rules.LOG_GROUP)
    assert rules.LOG_GROUPS_KMS_ENCRYPTED.check(group.type, group.inputs, stack) == []


def test_mandatory_rules_catch_breakage_in_the_programs_own_resources(stack_plan):
    """The rules read the property names the program really registers: break each, one is reported."""
    stack, plan = stack_plan
    gpu_group_ = next(r for r in plan.of_type(NG) if rules.is_gpu_node_group(r.inputs))
    gpu_template = next(r for r in plan.of_type(LT) if r.urn in gpu_group_.dependencies)
    cluster = plan.one(EKS)
    ray = plan.one(RAY)
    tls_policy = plan.one(rules.BUCKET_POLICY)
    control_plane_logs = plan.one(rules.LOG_GROUP)
    versioning = plan.one(VERSIONING)
    default_sg = plan.one(rules.DEFAULT_SECURITY_GROUP)
    ray_namespace = plan.one(NS, "ray-train")
    head_policy = plan.one(rules.NETWORK_POLICY)
    reader_daemonset = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters")

    def broken(registration, change) -> list[str]:
        original = registration.inputs
        registration.inputs = copy.deepcopy(original)
        change(registration.inputs)
        try:
            return mandatory_violations(plan, stack)
        finally:
            registration.inputs = original

    def worker(inputs: dict) -> dict:
        return inputs["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]

    breakages = {
        "imdsv2-required": (gpu_template, lambda p: p["metadataOptions"].update(httpTokens="optional")),
        "nodes-without-public-ips": (
            gpu_template,
            lambda p: p["networkInterfaces"][0].update(associatePublicIpAddress="true"),
        ),
        "gpu-node-group-efa-interface": (
            gpu_template,
            lambda p: [i.update(interfaceType="interface") for i in p["networkInterfaces"]],
        ),
        "gpu-node-group-single-subnet": (gpu_group_, lambda p: p["subnetIds"].append("subnet-elsewhere")),
        "eks-secrets-kms-encrypted": (cluster, lambda p: p.pop("encryptionConfigKeyArn")),
        "eks-api-not-open-to-internet": (
            cluster,
            lambda p: p.update(endpointPublicAccess=True, publicAccessCidrs=["0.0.0.0/0"]),
        ),
        "ray-ports-not-exposed": (
            ray,
            lambda p: p["spec"]["headGroupSpec"].update(serviceType="LoadBalancer"),
        ),
        "ray-worker-requests-equal-limits": (
            ray,
            lambda p: worker(p)["resources"]["requests"].update(cpu="1"),
        ),
        "container-images-pinned": (ray, lambda p: worker(p).update(image="rayproject/ray:latest")),
        "metadata-hop-limit-1": (
            gpu_template,
            lambda p: p["metadataOptions"].update(httpPutResponseHopLimit=2),
        ),
        "s3-buckets-tls-only": (
            tls_policy,
            lambda p: p.update(policy=p["policy"].replace('"Deny"', '"Allow"')),
        ),
        "log-retention-set": (control_plane_logs, lambda p: p.pop("retentionInDays")),
        "s3-buckets-versioned": (
            versioning,
            lambda p: p["versioningConfiguration"].update(status="Suspended"),
        ),
        "vpc-default-security-group-closed": (
            default_sg,
            lambda p: p.update(egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}]),
        ),
        "namespace-pod-security-enforced": (
            ray_namespace,
            lambda p: p["metadata"]["labels"].pop(rules.POD_SECURITY_ENFORCE),
        ),
        "namespace-pod-security-enforced (host network)": (
            reader_daemonset,
            lambda p: p["spec"]["template"]["spec"].update(hostPID=True),
        ),
        "ray-head-network-policy": (head_policy, lambda p: p["spec"].update(ingress=[{}])),
    }
    mandatory = {rule.name for rule in DEFINED_RULES if rule.enforcement is EnforcementLevel.MANDATORY}
    assert {name.split(" (")[0] for name in breakages} == mandatory
    for case, (registration, change) in breakages.items():
        rule_name = case.split(" (")[0]
        violations = broken(registration, change)
        assert len(violations) == 1 and violations[0].startswith(f"{rule_name} on "), (case, violations)
