"""The Ray pods' NetworkPolicy rules: every Ray pod isolated for ingress by rules naming their peers,
every namespace of Ray pods denying by default, on the program's own policies and on broken ones."""

from __future__ import annotations

import copy

import pytest
from pulumi_policy.proxy import UNKNOWN_ARRAY_VALUE, UNKNOWN_STRING_VALUE

from platform_contract import PART_OF_LABELS
from policy.rules import properties, ray_network
from policy.rules.properties import StackResource
from tests.harness.network_policies import selector_matches
from tests.harness.policy_resources import RAY
from workloads import manifests

NAMESPACE = "ray-train"
RAY_CR = StackResource(
    RAY,
    "urn:ray",
    {
        "metadata": {"name": "ray-train", "namespace": NAMESPACE},
        "spec": {
            "headGroupSpec": {"template": {"metadata": {"labels": dict(PART_OF_LABELS)}}},
            "workerGroupSpecs": [{"groupName": "gpu-workers", "template": {"spec": {}}}],
        },
    },
    (),
)
VPC = StackResource(properties.VPC, "urn:vpc", {"cidrBlock": "10.0.0.0/16"}, ())
EVERY_NAMESPACE = {"namespaceSelector": {}}


def policy(body: dict, urn: str = "urn:np", **spec) -> StackResource:
    body = copy.deepcopy(body)
    body["spec"].update(spec)
    return StackResource(properties.NETWORK_POLICY, urn, body, ())


def default_deny(**spec) -> StackResource:
    return policy(manifests.namespace_default_deny(NAMESPACE), "urn:deny", **spec)


def pods_policy(namespace_name: str = NAMESPACE, **spec) -> StackResource:
    return policy(
        manifests.ray_pods_network_policy("ray-train", namespace_name, "10.0.0.0/18"), "urn:pods", **spec
    )


# The head-only policy this rule replaced: the head's pods only, from the namespace's pods.
HEAD_ONLY = pods_policy(
    podSelector={"matchLabels": manifests.head_pod_labels("ray-train")},
    policyTypes=["Ingress"],
    ingress=[{"from": [{"podSelector": {}}]}],
)


def egress_anywhere(*ports: dict) -> dict:
    return {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": list(ports)}


def ingress_from(*peers) -> StackResource:
    return pods_policy(ingress=[{"from": list(peers)}])


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([RAY_CR, VPC, pods_policy(), default_deny()], None),
        # Isolated by the default deny alone: nothing gets in (and Ray does not run), nothing is open.
        ([RAY_CR, VPC, default_deny()], None),
        ([RAY_CR, VPC, HEAD_ONLY, default_deny()], None),
        (
            [
                RAY_CR,
                pods_policy(
                    podSelector={
                        "matchExpressions": [
                            {"key": "ray.io/cluster", "operator": "In", "values": ["ray-train"]}
                        ]
                    }
                ),
            ],
            None,
        ),
        # The template's labels reach the head's pods.
        ([RAY_CR, pods_policy(podSelector={"matchLabels": dict(PART_OF_LABELS)}), default_deny()], None),
        (
            [
                RAY_CR,
                VPC,
                ingress_from(
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                        "podSelector": {"matchLabels": {"ray.io/cluster": "ray-train"}},
                    },
                    {"ipBlock": {"cidr": "203.0.113.0/24"}},
                ),
            ],
            None,
        ),
        ([RAY_CR, VPC, pods_policy(policyTypes=UNKNOWN_ARRAY_VALUE)], None),
        (
            [
                RAY_CR,
                StackResource(properties.VPC, "urn:vpc", {"cidrBlock": UNKNOWN_STRING_VALUE}, ()),
                ingress_from({"ipBlock": {"cidr": "10.1.0.0/16"}}),
            ],
            None,
        ),
        (
            [
                StackResource(
                    RAY, "urn:ray", {"metadata": {"name": UNKNOWN_STRING_VALUE, "namespace": NAMESPACE}}, ()
                )
            ],
            None,
        ),
        (
            [RAY_CR],
            "no NetworkPolicy isolates the head for ingress; no NetworkPolicy isolates worker group gpu-workers",
        ),
        (
            [RAY_CR, pods_policy("default"), policy(manifests.namespace_default_deny("default"))],
            "no NetworkPolicy isolates the head",
        ),
        # The finding this rule answers: the head closed, its workers open to every pod of the cluster.
        ([RAY_CR, VPC, HEAD_ONLY], "no NetworkPolicy isolates worker group gpu-workers for ingress"),
        ([RAY_CR, pods_policy(policyTypes=["Egress"])], "no NetworkPolicy isolates the head for ingress"),
        (
            [
                RAY_CR,
                pods_policy(
                    podSelector={
                        "matchExpressions": [
                            {"key": "ray.io/node-type", "operator": "NotIn", "values": ["worker"]}
                        ]
                    }
                ),
            ],
            "no NetworkPolicy isolates worker group gpu-workers",
        ),
        (
            [RAY_CR, pods_policy(ingress=[{}]), default_deny()],
            "admits the head and worker group gpu-workers from no `from` (everyone) (ingress rule 0)",
        ),
        (
            [RAY_CR, pods_policy(ingress=[{"from": []}])],
            "and worker group gpu-workers from no `from` (everyone)",
        ),
        (
            [RAY_CR, VPC, ingress_from(EVERY_NAMESPACE), default_deny()],
            "namespaceSelector {} (every namespace)",
        ),
        (
            [
                RAY_CR,
                ingress_from(
                    {**EVERY_NAMESPACE, "podSelector": {"matchLabels": {"ray.io/cluster": "ray-train"}}}
                ),
            ],
            "namespaceSelector {} (every namespace)",
        ),
        (
            [
                RAY_CR,
                ingress_from(
                    {
                        "namespaceSelector": {
                            "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["x"]}]
                        }
                    }
                ),
            ],
            "(every namespace)",
        ),
        (
            [RAY_CR, VPC, ingress_from({"ipBlock": {"cidr": "0.0.0.0/0"}}), default_deny()],
            "ipBlock 0.0.0.0/0 (every address)",
        ),
        (
            [RAY_CR, VPC, ingress_from({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/24"]}})],
            "holds addresses of the VPC 10.0.0.0/16",
        ),
    ],
)
def test_ray_pods_network_policy(resources, expected):
    violations = ray_network.ray_pods_network_policy.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:ray" and expected in violations[0][1], (
            violations
        )


RAY_JOB = StackResource(
    "kubernetes:ray.io/v1:RayJob",
    "urn:job",
    {"metadata": {"name": "job", "namespace": "jobs"}, "spec": {"rayClusterSpec": {}}},
    (),
)
# What a RayJob's and a RayService's pods carry that a policy can name: their templates' labels.
JOB_LABELS = {"app.kubernetes.io/instance": "train-job"}


def ray_cluster_spec(labels: dict | None = None) -> dict:
    template = {"metadata": {"labels": labels}, "spec": {}} if labels else {"spec": {}}
    return {
        "headGroupSpec": {"template": template},
        "workerGroupSpecs": [{"groupName": "gpu-workers", "template": template}],
    }


def ray_job(labels: dict | None = None) -> StackResource:
    spec = {"rayClusterSpec": ray_cluster_spec(labels), "entrypoint": "python train.py"}
    return StackResource(
        "kubernetes:ray.io/v1:RayJob",
        "urn:ray",
        {"metadata": {"name": "train-job", "namespace": NAMESPACE}, "spec": spec},
        (),
    )


def ray_service(labels: dict | None = None) -> StackResource:
    spec = {"rayClusterConfig": ray_cluster_spec(labels), "serveConfigV2": "applications: []"}
    return StackResource(
        "kubernetes:ray.io/v1:RayService",
        "urn:ray",
        {"metadata": {"name": "serve", "namespace": NAMESPACE}, "spec": spec},
        (),
    )


def selecting(selector: dict, *ingress: dict) -> StackResource:
    """The pods' policy with another selector and ingress rules (admitting the RayCluster's own pods without)."""
    return pods_policy(podSelector=selector, **({"ingress": list(ingress)} if ingress else {}))


@pytest.mark.parametrize(
    "resources, expected",
    [
        # Selected by their templates' label, admitting only their own pods: isolated, nothing open.
        ([ray_job(JOB_LABELS), VPC, selecting({"matchLabels": JOB_LABELS}), default_deny()], None),
        ([ray_service(JOB_LABELS), VPC, selecting({"matchLabels": JOB_LABELS}), default_deny()], None),
        ([ray_job(), VPC, default_deny()], None),
        # Every Ray pod of the namespace, by KubeRay's own label.
        ([ray_job(), VPC, selecting({"matchLabels": {"ray.io/is-ray-node": "yes"}})], None),
        # A RayJob that runs on an existing RayCluster makes no pods.
        (
            [
                StackResource(
                    "kubernetes:ray.io/v1:RayJob",
                    "urn:ray",
                    {
                        "metadata": {"name": "j", "namespace": NAMESPACE},
                        "spec": {"clusterSelector": {"ray.io/cluster": "ray-train"}},
                    },
                    (),
                )
            ],
            None,
        ),
        # A RayJob's pods are not the RayJob's name's RayCluster's: KubeRay adds a random suffix.
        (
            [ray_job(), VPC, selecting({"matchLabels": {"ray.io/cluster": "train-job"}})],
            "RayJob train-job in namespace ray-train: no NetworkPolicy isolates the head for ingress; no "
            "NetworkPolicy isolates worker group gpu-workers for ingress. Every Ray pod serves jobs (the dashboard "
            "agent on each, the head's Ray ports): select them by a label of their templates (e.g. "
            "app.kubernetes.io/instance): KubeRay names the RayJob's RayCluster train-job-<5 random characters> and "
            "gives its pods no label of the RayJob's",
        ),
        # Nor do they carry the RayJob's origin labels, which KubeRay puts on the RayCluster alone.
        (
            [
                ray_service(),
                selecting(
                    {
                        "matchLabels": {
                            "ray.io/originated-from-cr-name": "serve",
                            "ray.io/originated-from-crd": "RayService",
                        }
                    }
                ),
            ],
            "RayService serve in namespace ray-train: no NetworkPolicy isolates the head for ingress",
        ),
        # The wide grants: a RayJob's pods open to every namespace, or to every address.
        (
            [
                ray_job(JOB_LABELS),
                VPC,
                selecting({"matchLabels": JOB_LABELS}, {"from": [EVERY_NAMESPACE]}),
                default_deny(),
            ],
            "RayJob train-job in namespace ray-train: NetworkPolicy ray-train-pods admits the head and worker group "
            "gpu-workers from namespaceSelector {} (every namespace) (ingress rule 0)",
        ),
        (
            [
                ray_service(),
                VPC,
                selecting({"matchLabels": {"ray.io/is-ray-node": "yes"}}, {}),
                default_deny(),
            ],
            "RayService serve in namespace ray-train: NetworkPolicy ray-train-pods admits the head and worker group "
            "gpu-workers from no `from` (everyone) (ingress rule 0)",
        ),
        (
            [
                ray_job(),
                VPC,
                default_deny(),
                selecting(
                    {"matchExpressions": [{"key": "ray.io/cluster", "operator": "Exists"}]},
                    {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]},
                ),
            ],
            "admits the head and worker group gpu-workers from ipBlock 0.0.0.0/0 (every address)",
        ),
    ],
)
def test_ray_pods_network_policy_of_ray_jobs_and_services(resources, expected):
    violations = ray_network.ray_pods_network_policy.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:ray" and expected in violations[0][1], (
            violations
        )
        assert "\n" not in violations[0][1]


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"ray.io/is-ray-node": "yes"}},
        {"matchLabels": {"app.kubernetes.io/created-by": "kuberay-operator"}},
        {"matchLabels": {"ray.io/identifier": "ray-train-worker"}},
        {"matchLabels": {"team": "ml"}},
    ],
)
def test_a_policy_selecting_by_kuberays_own_labels_opens_the_pods_it_selects(selector):
    """KubeRay labels every pod it makes; a group's `labels` reach its pods as its template's do."""
    cluster = copy.deepcopy(RAY_CR)
    cluster.props["spec"]["workerGroupSpecs"][0]["labels"] = {"team": "ml"}
    violations = ray_network.ray_pods_network_policy.check(
        [cluster, VPC, default_deny(), selecting(selector, {"from": [EVERY_NAMESPACE]})]
    )
    assert len(violations) == 1 and "from namespaceSelector {} (every namespace)" in violations[0][1], (
        violations
    )


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([RAY_CR, VPC, pods_policy(), default_deny()], None),
        ([RAY_JOB, VPC, policy(manifests.namespace_default_deny("jobs"))], None),
        # Egress to a VPC block on one port (the counter reader's rule), or HTTPS anywhere: named ports.
        (
            [
                RAY_CR,
                VPC,
                pods_policy(
                    egress=[{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 9478}]}]
                ),
                default_deny(),
            ],
            None,
        ),
        (
            [
                StackResource(
                    RAY, "urn:ray", {"metadata": {"name": "r", "namespace": UNKNOWN_STRING_VALUE}}, ()
                )
            ],
            None,
        ),
        ([RAY_CR, VPC, pods_policy(), default_deny(policyTypes=UNKNOWN_ARRAY_VALUE)], None),
        (
            [RAY_CR, VPC, pods_policy()],
            "no NetworkPolicy selects every pod (`podSelector: {}`) for Ingress and Egress with no rules",
        ),
        ([RAY_JOB, default_deny()], "namespace jobs holds Ray pods: no NetworkPolicy selects every pod"),
        (
            [RAY_CR, pods_policy(), default_deny(policyTypes=["Ingress"])],
            "no NetworkPolicy selects every pod",
        ),
        (
            [
                RAY_CR,
                pods_policy(),
                default_deny(podSelector={"matchLabels": {"ray.io/cluster": "ray-train"}}),
            ],
            "no NetworkPolicy selects every pod",
        ),
        (
            [RAY_CR, pods_policy(), default_deny(ingress=[{"from": [{"podSelector": {}}]}])],
            "no NetworkPolicy selects every pod",
        ),
        (
            [RAY_CR, VPC, pods_policy(egress=[{}]), default_deny()],
            "NetworkPolicy ray-train-pods admits egress on every port to no `to` (everyone) (egress rule 0)",
        ),
        (
            [RAY_CR, VPC, pods_policy(egress=[{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]), default_deny()],
            "every port to ipBlock 0.0.0.0/0",
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(
                    egress=[{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP"}]}]
                ),
                default_deny(),
            ],
            "every port to ipBlock 0.0.0.0/0",
        ),
        (
            [RAY_CR, VPC, pods_policy(egress=[{"to": [EVERY_NAMESPACE]}]), default_deny()],
            "every port to namespaceSelector {} (every namespace)",
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[{"to": [{"ipBlock": {"cidr": "10.0.0.0/20"}}]}]),
                default_deny(),
            ],
            "holds addresses of the VPC",
        ),
        # Port ranges: narrower than 1024 ports and short of 65535 name their ports; wider ones do not.
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[egress_anywhere({"port": 8000, "endPort": 9022})]),
                default_deny(),
            ],
            None,
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[egress_anywhere({"port": 443.0, "endPort": 443.0})]),
                default_deny(),
            ],
            None,
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[egress_anywhere({"port": "https", "endPort": 65535})]),
                default_deny(),
            ],
            None,
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[egress_anywhere({"port": 1, "endPort": 65535})]),
                default_deny(),
            ],
            "NetworkPolicy ray-train-pods admits egress on ports 1-65535 (as good as every port) to ipBlock "
            "0.0.0.0/0 (every address) (egress rule 0)",
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(egress=[egress_anywhere({"port": 8000.0, "endPort": 9023.0})]),
                default_deny(),
            ],
            "admits egress on ports 8000-9023 (as good as every port)",
        ),
        (
            [
                RAY_CR,
                VPC,
                pods_policy(
                    egress=[
                        egress_anywhere({"port": 443}, {"protocol": "UDP", "port": 65000, "endPort": 65535})
                    ]
                ),
                default_deny(),
            ],
            "admits egress on ports 65000-65535 (as good as every port) to ipBlock 0.0.0.0/0",
        ),
        (
            [
                RAY_JOB,
                VPC,
                policy(manifests.namespace_default_deny("jobs")),
                policy(
                    {
                        "metadata": {"name": "out", "namespace": "jobs"},
                        "spec": {
                            "podSelector": {},
                            "policyTypes": ["Egress"],
                            "egress": [{"to": [EVERY_NAMESPACE], "ports": [{"port": 1024, "endPort": 2047}]}],
                        },
                    },
                    "urn:out",
                ),
            ],
            "namespace jobs holds Ray pods: NetworkPolicy out admits egress on ports 1024-2047",
        ),
    ],
)
def test_ray_namespace_default_deny(resources, expected):
    violations = ray_network.ray_namespace_default_deny.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
        assert violations[0][0] == resources[0].urn


@pytest.mark.parametrize(
    "selector",
    [
        {},
        {"matchLabels": {"ray.io/cluster": "ray-train"}},
        {"matchLabels": {"ray.io/cluster": "other"}},
        {"matchExpressions": [{"key": "ray.io/node-type", "operator": "In", "values": ["head", "worker"]}]},
        {"matchExpressions": [{"key": "ray.io/node-type", "operator": "NotIn", "values": ["head"]}]},
        {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
        {
            "matchLabels": {"ray.io/cluster": "ray-train"},
            "matchExpressions": [{"key": "ray.io/group", "operator": "In", "values": ["headgroup"]}],
        },
    ],
)
def test_the_pack_reads_selectors_as_the_network_policy_model_does(selector):
    """The pack's own reading (its virtualenv cannot import the tests' model) against the model's."""
    for labels in (
        {"ray.io/cluster": "ray-train", "ray.io/node-type": "head", "ray.io/group": "headgroup"},
        {"ray.io/cluster": "ray-train", "ray.io/node-type": "worker", "ray.io/group": "gpu-workers"},
        {"team": "x"},
    ):
        assert ray_network.selects(selector, labels) == selector_matches(selector, labels)
