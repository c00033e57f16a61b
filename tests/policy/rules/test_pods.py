"""The pods' rules: namespaces that refuse privileged pods, pinned images (the same rule as the program's)."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_OBJECT_VALUE,
)

import platform_contract
from policy.rules import pods
from policy.rules.properties import StackResource
from tests.harness.policy_resources import (
    GUARANTEED,
    NS,
    RAY,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
    ray_cluster,
    worker_container,
)
from workloads import efa_counter_reader

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # container-images-pinned
    (pods.container_images_pinned, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    (
        pods.container_images_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED, image="repo/ray@sha256:" + "a" * 64)),
        "dev",
        None,
    ),
    (
        pods.container_images_pinned,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": "localhost:5000/ray:2.58.0"}]}},
        "dev",
        None,
    ),
    (
        pods.container_images_pinned,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": UNKNOWN}]}},
        "dev",
        None,
    ),
    (
        pods.container_images_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED), head_image="repo/ray:latest"),
        "dev",
        "container ray-head: image repo/ray:latest is tagged latest",
    ),
    (
        pods.container_images_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED, image="localhost:5000/ray")),
        "dev",
        "container ray-worker: image localhost:5000/ray has no tag",
    ),
    (
        pods.container_images_pinned,
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
        pods.container_images_pinned,
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
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(pods, CASES)


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
    assert pods.image_pin_problem(image) == platform_contract.image_pin_problem(image)


def ns_resource(name: str, labels) -> StackResource:
    return StackResource(NS, f"urn:ns-{name}", {"metadata": {"name": name, "labels": labels}}, ())


HOST_NETWORK_LABELS = {
    pods.POD_SECURITY_ENFORCE: "privileged",
    pods.POD_SECURITY_WARN: "baseline",
    pods.POD_SECURITY_AUDIT: "baseline",
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
        ([ns_resource("ray-train", {pods.POD_SECURITY_ENFORCE: "baseline"})], None),
        ([ns_resource("ray-train", {pods.POD_SECURITY_ENFORCE: "restricted"})], None),
        ([ns_resource("ray-train", UNKNOWN_OBJECT_VALUE)], None),
        ([ns_resource("ray-train", {pods.POD_SECURITY_WARN: "restricted"})], "is not set"),
        ([StackResource(NS, "urn:ns", {"metadata": {"name": "n"}}, ())], "is not set"),
        # privileged: only for host-network pods alone, warned and audited at baseline
        ([ns_resource("agents", HOST_NETWORK_LABELS), node_agent()], None),
        ([ns_resource("agents", {pods.POD_SECURITY_ENFORCE: "privileged"})], "it warns at baseline"),
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
    violations = pods.namespace_pod_security.check(resources)
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
    assert pods.namespace_pod_security.check(resources) == []
