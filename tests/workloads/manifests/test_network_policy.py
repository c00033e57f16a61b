"""The Ray namespace's NetworkPolicies, judged by a model of how Kubernetes decides a connection
(`tests/harness/network_policies.py`), and the model itself on the Kubernetes documentation's examples."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from infra.aws_rules.address_layout import zone_cidrs
from platform_contract import RAY_PORTS
from tests.harness.manifest_checks import KUBERNETES_VERSION
from tests.harness.network_policies import allowed, host, outside, pod, policy_types, selector_matches
from workloads import manifests
from workloads.efa_counter_reader import READER_PORT

# Every Ray pod's dashboard agent, which serves `POST /api/job_agent/jobs/` (KubeRay v1.7.0,
# utils.DefaultDashboardAgentListenPort, passed as --dashboard-agent-listen-port in common/pod.go).
DASHBOARD_AGENT_PORT = 52365
CLUSTER, NAMESPACE = "ray-train", "ray-train"
GPU_SUBNET = zone_cidrs("10.0.0.0/16", "us-east-2a")[0]
POLICIES = [
    manifests.namespace_default_deny(NAMESPACE),
    manifests.ray_pods_network_policy(CLUSTER, NAMESPACE, GPU_SUBNET),
]
HEAD = pod(
    NAMESPACE,
    {**manifests.head_pod_labels(CLUSTER), "ray.io/group": "headgroup"},
    address="10.0.130.10",
    node="system-1",
)
WORKER_LABELS = {
    manifests.RAY_CLUSTER_LABEL: CLUSTER,
    manifests.RAY_NODE_TYPE_LABEL: "worker",
    "ray.io/group": "gpu-workers",
}
WORKER = pod(NAMESPACE, WORKER_LABELS, address="10.0.1.20", node="gpu-1")
OTHER_WORKER = pod(NAMESPACE, WORKER_LABELS, address="10.0.2.30", node="gpu-2")
GPU_NODE = host("10.0.1.5", node="gpu-1")  # its address, where the EFA counter reader listens
COREDNS = pod("kube-system", {"k8s-app": "kube-dns"}, address="10.0.131.2")
OUTSIDERS = {
    "a pod of another namespace": pod("default", {"app": "web"}, address="10.0.131.7"),
    "the KubeRay operator": pod(
        manifests.KUBERAY_OPERATOR.namespace, {"app.kubernetes.io/name": "kuberay-operator"}
    ),
    "a pod of another namespace wearing the Ray labels": pod("elsewhere", WORKER_LABELS),
    "a pod of the Ray namespace that is no Ray pod": pod(NAMESPACE, {"app": "debug"}),
    "a pod of another RayCluster in the namespace": pod(NAMESPACE, {manifests.RAY_CLUSTER_LABEL: "other"}),
    "another node": host("10.0.2.5", node="gpu-2"),
    "an address outside": outside("203.0.113.9"),
}


def test_the_selectors_name_the_pods_kuberay_labels():
    assert manifests.head_pod_selector(CLUSTER) == "ray.io/cluster=ray-train,ray.io/node-type=head"
    assert manifests.worker_pod_selector(CLUSTER) == "ray.io/cluster=ray-train,ray.io/node-type=worker"
    assert manifests.ray_cluster_pod_labels(CLUSTER) == {"ray.io/cluster": "ray-train"}


@pytest.mark.parametrize("who", OUTSIDERS)
def test_nothing_outside_the_ray_cluster_reaches_a_ray_pod(who):
    """Not a worker's dashboard agent (its Jobs API), nor any of the head's Ray ports, nor any other port."""
    source = OUTSIDERS[who]
    for port in [DASHBOARD_AGENT_PORT, 6380, 8080, 12345]:
        assert not allowed(POLICIES, source, WORKER, port), port
    for port in [*RAY_PORTS.values(), DASHBOARD_AGENT_PORT]:
        assert not allowed(POLICIES, source, HEAD, port), port


def test_the_ray_pods_reach_each_other_on_every_port():
    """The GCS, the dashboard, the agents, raylets, object managers, and NCCL between the workers."""
    for port in RAY_PORTS.values():
        assert allowed(POLICIES, WORKER, HEAD, port)
    for port in [DASHBOARD_AGENT_PORT, 8076, 10002, 43123]:
        assert allowed(POLICIES, HEAD, WORKER, port)
        assert allowed(POLICIES, WORKER, OTHER_WORKER, port)


def test_the_kubelet_probes_a_ray_pod_from_its_own_node():
    assert allowed(POLICIES, host("10.0.1.5", node="gpu-1"), WORKER, DASHBOARD_AGENT_PORT)
    assert allowed(POLICIES, host("10.0.130.4", node="system-1"), HEAD, RAY_PORTS["dashboard"])


def test_the_ray_pods_reach_dns_https_and_their_nodes_counter_reader_and_nothing_else():
    for ray_pod in (HEAD, WORKER):
        assert allowed(POLICIES, ray_pod, COREDNS, 53, "UDP")
        assert allowed(POLICIES, ray_pod, COREDNS, 53, "TCP")
        assert not allowed(POLICIES, ray_pod, COREDNS, 9153)  # CoreDNS's metrics
        assert not allowed(POLICIES, ray_pod, pod("kube-system", {"k8s-app": "other"}), 53, "UDP")
        assert not allowed(POLICIES, ray_pod, pod("default", {"k8s-app": "kube-dns"}), 53, "UDP")
        for address in ("52.216.8.1", "18.160.0.7", "10.0.131.7"):  # S3, the Hub's CDN, in the VPC
            assert allowed(POLICIES, ray_pod, outside(address), 443)
            assert not allowed(POLICIES, ray_pod, outside(address), 443, "UDP")
        for port in (80, 5432, 6379, 22):
            assert not allowed(POLICIES, ray_pod, outside("52.216.8.1"), port)
        assert not allowed(POLICIES, ray_pod, outside("169.254.169.254"), 80)  # instance metadata
        assert not allowed(POLICIES, ray_pod, OUTSIDERS["a pod of another namespace"], 8080)
    assert allowed(POLICIES, WORKER, GPU_NODE, READER_PORT)
    assert not allowed(POLICIES, WORKER, GPU_NODE, 10250)  # the kubelet
    assert not allowed(POLICIES, HEAD, host("10.0.130.4", node="system-1"), READER_PORT)  # not a GPU node


def test_a_pod_of_the_namespace_no_other_policy_selects_reaches_nothing():
    debug = OUTSIDERS["a pod of the Ray namespace that is no Ray pod"]
    assert not allowed(POLICIES, debug, COREDNS, 53, "UDP")
    assert not allowed(POLICIES, debug, outside("52.216.8.1"), 443)
    assert not allowed(POLICIES, debug, HEAD, RAY_PORTS["gcs-server"])


def test_an_open_ingress_rule_is_seen_by_the_model():
    opened = copy.deepcopy(POLICIES)
    opened[1]["spec"]["ingress"] = [{}]
    assert allowed(opened, OUTSIDERS["a pod of another namespace"], WORKER, DASHBOARD_AGENT_PORT)
    opened[1]["spec"]["ingress"] = [{"from": [{"namespaceSelector": {}}]}]
    assert allowed(opened, OUTSIDERS["a pod of another namespace"], WORKER, DASHBOARD_AGENT_PORT)


def test_network_policy_schema_check_catches_a_bad_field():
    policy = copy.deepcopy(POLICIES[1])
    policy["spec"]["podSelectors"] = policy["spec"].pop("podSelector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)


# The model itself, on the examples of the Kubernetes documentation ("Network Policies").

DOCS_EXAMPLE = {
    "metadata": {"name": "test-network-policy", "namespace": "default"},
    "spec": {
        "podSelector": {"matchLabels": {"role": "db"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                    {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                    {"podSelector": {"matchLabels": {"role": "frontend"}}},
                ],
                "ports": [{"protocol": "TCP", "port": 6379}],
            }
        ],
        "egress": [
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"protocol": "TCP", "port": 5978}]}
        ],
    },
}
DB = pod("default", {"role": "db"})


def test_the_documentations_example_policy():
    policies = [DOCS_EXAMPLE]
    frontend = pod("default", {"role": "frontend"})
    assert allowed(policies, frontend, DB, 6379)
    assert not allowed(policies, frontend, DB, 6380)
    assert not allowed(policies, frontend, DB, 6379, "UDP")
    assert not allowed(policies, pod("other", {"role": "frontend"}), DB, 6379)
    assert allowed(policies, pod("other", namespace_labels={"project": "myproject"}), DB, 6379)
    assert allowed(policies, outside("172.17.0.5"), DB, 6379)
    assert not allowed(policies, outside("172.17.1.5"), DB, 6379)  # except
    assert allowed(policies, DB, outside("10.0.0.7"), 5978)
    assert not allowed(policies, DB, outside("10.0.1.7"), 5978)
    assert not allowed(policies, DB, frontend, 80)  # isolated for egress
    assert allowed(policies, frontend, pod("default", {"role": "cache"}), 80)  # not selected


def test_one_peer_with_both_selectors_is_and_two_peers_are_or():
    both = {
        "namespaceSelector": {"matchLabels": {"user": "alice"}},
        "podSelector": {"matchLabels": {"role": "client"}},
    }
    either = [
        {"namespaceSelector": {"matchLabels": {"user": "alice"}}},
        {"podSelector": {"matchLabels": {"role": "client"}}},
    ]
    alice_client = pod("a", {"role": "client"}, namespace_labels={"user": "alice"})
    alice_other = pod("a", {"role": "web"}, namespace_labels={"user": "alice"})
    local_client = pod("default", {"role": "client"})
    for peers, admitted in (
        ([both], {"alice_client"}),
        (either, {"alice_client", "alice_other", "local_client"}),
    ):
        policies = [{**DOCS_EXAMPLE, "spec": {**DOCS_EXAMPLE["spec"], "ingress": [{"from": peers}]}}]
        sources = {"alice_client": alice_client, "alice_other": alice_other, "local_client": local_client}
        assert {name for name, source in sources.items() if allowed(policies, source, DB, 6379)} == admitted


def test_isolation_defaults_and_the_pods_own_node():
    anyone = pod("other")
    assert allowed([], anyone, DB, 1)  # no policy: not isolated
    deny_ingress = {"metadata": {"namespace": "default"}, "spec": {"podSelector": {}}}
    assert policy_types(deny_ingress) == {"Ingress"}
    assert not allowed([deny_ingress], anyone, DB, 1)
    assert allowed([deny_ingress], DB, anyone, 1)  # egress untouched
    own_node, other_node = host("10.0.0.1", node="n1"), host("10.0.0.2", node="n2")
    on_n1 = pod("default", {"role": "db"}, node="n1")
    assert allowed([deny_ingress], own_node, on_n1, 1) and not allowed([deny_ingress], other_node, on_n1, 1)
    egress_rules = {"metadata": {"namespace": "default"}, "spec": {"podSelector": {}, "egress": [{}]}}
    assert policy_types(egress_rules) == {"Ingress", "Egress"}
    deny_all = {**deny_ingress, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}
    assert not allowed([deny_all], DB, anyone, 1)
    assert allowed([deny_all, egress_rules], DB, anyone, 1)  # additive
    assert not allowed([deny_all], pod("default"), DB, 1)


def test_ports_by_name_and_range_and_selector_expressions():
    ranged = {
        "metadata": {"namespace": "default"},
        "spec": {
            "podSelector": {},
            "ingress": [
                {"ports": [{"port": 32000, "endPort": 32768}, {"port": "metrics"}, {"protocol": "UDP"}]}
            ],
        },
    }
    server = pod("default", ports={"metrics": 9090})
    assert allowed([ranged], pod("x"), server, 32768) and not allowed([ranged], pod("x"), server, 32769)
    assert allowed([ranged], pod("x"), server, 9090) and not allowed([ranged], pod("x"), server, 9091)
    assert allowed([ranged], pod("x"), server, 53, "UDP")
    labels = {"tier": "db", "env": "prod"}
    assert selector_matches({}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches(
        {"matchLabels": {"env": "prod"}, "matchExpressions": [{"key": "team", "operator": "Exists"}]}, labels
    )
