"""The pods' rules: namespaces that refuse privileged pods, Helm charts only in declared namespaces, pinned images and, outside dev stacks, images by digest (the same rules as the program's)."""

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
from workloads import efa_counter_reader, manifests

DIGEST_PINNED = "repo/ray@sha256:" + "a" * 64

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
    # container-images-digest-pinned
    (
        pods.container_images_digest_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED)),
        "dev",
        None,
    ),
    (
        pods.container_images_digest_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED), head_image="repo/ray:2.58.0"),
        "team-dev",
        None,
    ),
    (
        pods.container_images_digest_pinned,
        RAY,
        ray_cluster(
            worker_container(GUARANTEED, GUARANTEED, image=DIGEST_PINNED),
            head_image="repo/ray:2.58.0@sha256:" + "a" * 64,
        ),
        "us-east-1",
        None,
    ),
    (
        pods.container_images_digest_pinned,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": UNKNOWN}]}},
        "us-east-1",
        None,
    ),
    (pods.container_images_digest_pinned, "aws:ec2/vpc:Vpc", {"image": "repo/ray:2.58.0"}, "prod", None),
    (
        pods.container_images_digest_pinned,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED, image=DIGEST_PINNED)),
        "us-east-1",
        "container ray-head: image repo/ray:2.58.0 is a tag, which its publisher can move to other bits, "
        "and stack us-east-1 is not a dev stack: pin it as <repository>@sha256:<digest>",
    ),
    (
        pods.container_images_digest_pinned,
        "kubernetes:apps/v1:DaemonSet",
        {
            "spec": {
                "template": {
                    "spec": {
                        "initContainers": [{"name": "init", "image": "repo/x@sha256:" + "A" * 64}],
                        "containers": [{"name": "c", "image": DIGEST_PINNED}],
                    }
                }
            }
        },
        "devices",
        "container init: image repo/x@sha256:AAAA",
    ),
    (
        pods.container_images_digest_pinned,
        "kubernetes:core/v1:Pod",
        {"spec": {"containers": [{"name": "c", "image": "repo/x@sha512:" + "a" * 128}]}},
        "prod",
        "has a digest other than sha256",
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
        "repo/ray@sha256:" + "A" * 64,
        "repo/ray@sha512:" + "0" * 128,
        "repo/ray@",
    ],
)
def test_pack_image_rule_is_the_programs(image):
    assert pods.image_pin_problem(image) == platform_contract.image_pin_problem(image)
    assert pods.image_digest_problem(image) == platform_contract.image_digest_problem(image)


def ns_resource(name: str, labels) -> StackResource:
    return StackResource(NS, f"urn:ns-{name}", {"metadata": {"name": name, "labels": labels}}, ())


def k8s(resource_type: str, name: str, props: dict) -> StackResource:
    """A Kubernetes resource of the stack, with a URN as the engine writes it."""
    return StackResource(resource_type, f"urn:pulumi:dev::eks-ray-train::{resource_type}::{name}", props, ())


HOST_NETWORK_LABELS = {
    pods.POD_SECURITY_ENFORCE: "privileged",
    pods.POD_SECURITY_WARN: "baseline",
    pods.POD_SECURITY_AUDIT: "baseline",
}
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
POD = "kubernetes:core/v1:Pod"
HARDENED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def agent_container(name: str = "reader", **context) -> dict:
    """A container hardened as the EFA counter reader's, with `context` over its security context."""
    return {"name": name, "image": "repo/ray:2.58.0", "securityContext": {**HARDENED, **context}}


def node_agent(namespace_name: str = "agents", template_metadata: dict | None = None, **pod) -> StackResource:
    """A DaemonSet whose pods need the host's network namespace and nothing else, hardened as the
    EFA counter reader's; `pod` over its pod spec."""
    spec = {
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True},
        "containers": [agent_container()],
        **pod,
    }
    props = {
        "metadata": {"name": "agent", "namespace": namespace_name},
        "spec": {"template": {"metadata": template_metadata or {}, "spec": spec}},
    }
    return k8s(DAEMONSET, "agent", props)


AGENTS = ns_resource("agents", HOST_NETWORK_LABELS)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/reader"


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([ns_resource("ray-train", {pods.POD_SECURITY_ENFORCE: "baseline"})], None),
        ([ns_resource("ray-train", {pods.POD_SECURITY_ENFORCE: "restricted"})], None),
        ([ns_resource("ray-train", UNKNOWN_OBJECT_VALUE)], None),
        ([ns_resource("ray-train", {pods.POD_SECURITY_WARN: "restricted"})], "is not set"),
        ([StackResource(NS, "urn:ns", {"metadata": {"name": "n"}}, ())], "is not set"),
        # privileged: only for host-network pods alone, warned and audited at baseline
        ([AGENTS, node_agent()], None),
        ([ns_resource("agents", {pods.POD_SECURITY_ENFORCE: "privileged"})], "it warns at baseline"),
        ([AGENTS], "the stack puts host-network pods in it (it puts none)"),
        ([AGENTS, node_agent(hostNetwork=False)], "one does not"),
        ([AGENTS, node_agent(hostPID=True)], "hostPID: true"),
        (
            [AGENTS, node_agent(volumes=[{"name": "sys", "hostPath": {"path": "/sys"}}])],
            "volume sys is a hostPath",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container("c", privileged=True)])],
            "container c is privileged",
        ),
        (
            [
                AGENTS,
                node_agent(
                    containers=[agent_container("c", capabilities={"add": ["NET_ADMIN"], "drop": ["ALL"]})]
                ),
            ],
            "container c adds capabilities",
        ),
        (
            [AGENTS, node_agent(containers=[{**agent_container("c"), "ports": [{"hostPort": 22}]}])],
            "container c takes a host port",
        ),
        # A pod of another namespace does not make a privileged one acceptable.
        ([AGENTS, node_agent("elsewhere")], "it puts none"),
        # Pinned to the reader: a DaemonSet's pods, non-root, every capability dropped, a read-only
        # root, no privilege escalation, no service account token.
        (
            [
                AGENTS,
                k8s(
                    POD,
                    "shell",
                    {
                        "metadata": {"namespace": "agents"},
                        "spec": {
                            "hostNetwork": True,
                            "containers": [{"name": "sh", "image": "repo/ray:2.58.0"}],
                        },
                    },
                ),
            ],
            "Pod shell is not a DaemonSet",
        ),
        (
            [
                AGENTS,
                node_agent(
                    securityContext={},
                    automountServiceAccountToken=None,
                    containers=[{"name": "bare", "image": "repo/ray:2.58.0"}],
                ),
            ],
            "container bare does not set runAsNonRoot: true, capabilities.drop: [ALL], readOnlyRootFilesystem: true, allowPrivilegeEscalation: false",
        ),
        (
            [AGENTS, node_agent(automountServiceAccountToken=True)],
            "a pod does not set automountServiceAccountToken: false",
        ),
        ([AGENTS, node_agent(securityContext={})], "container reader does not set runAsNonRoot: true"),
        (
            [AGENTS, node_agent(containers=[agent_container(runAsNonRoot=False)])],
            "does not set runAsNonRoot: true",
        ),
        ([AGENTS, node_agent(securityContext={}, containers=[agent_container(runAsNonRoot=True)])], None),
        (
            [AGENTS, node_agent(containers=[agent_container(capabilities={"drop": ["NET_RAW"]})])],
            "does not set capabilities.drop: [ALL]",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container(readOnlyRootFilesystem=False)])],
            "does not set readOnlyRootFilesystem: true",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container(allowPrivilegeEscalation=None)])],
            "does not set allowPrivilegeEscalation: false",
        ),
        (
            [AGENTS, node_agent(initContainers=[{"name": "init", "image": "repo/ray:2.58.0"}])],
            "container init does not set",
        ),
        # Nothing installs into it that the pack cannot see: Helm, YAML, kustomize.
        (
            [
                AGENTS,
                node_agent(),
                k8s("kubernetes:helm.sh/v3:Release", "chart", {"chart": "c", "namespace": "agents"}),
            ],
            "no Helm, YAML or kustomize resource installs into it, since the pack cannot see their pods (Release chart names it)",
        ),
        (
            [
                AGENTS,
                node_agent(),
                k8s("kubernetes:helm.sh/v4:Chart", "chart", {"chart": "c", "namespace": UNKNOWN}),
            ],
            "(Chart chart names an unknown namespace)",
        ),
        (
            [AGENTS, node_agent(), k8s("kubernetes:yaml/v2:ConfigGroup", "objects", {"files": ["a.yaml"]})],
            "(ConfigGroup objects names no namespace)",
        ),
        (
            [AGENTS, node_agent(), k8s("kubernetes:yaml:ConfigFile", "file", {"file": "a.yaml"})],
            "(ConfigFile file names no namespace)",
        ),
        (
            [
                AGENTS,
                node_agent(),
                k8s("kubernetes:kustomize/v2:Directory", "dir", {"directory": "d", "namespace": "agents"}),
            ],
            "(Directory dir names it)",
        ),
        (
            [
                AGENTS,
                node_agent(),
                k8s("kubernetes:helm.sh/v3:Release", "chart", {"chart": "c", "namespace": "kube-system"}),
            ],
            None,
        ),
        # Every pod template names a known namespace while one enforces privileged.
        (
            [
                AGENTS,
                node_agent(),
                k8s(
                    "kubernetes:apps/v1:Deployment",
                    "web",
                    {"metadata": {"namespace": UNKNOWN}, "spec": {"template": {"spec": {"containers": []}}}},
                ),
            ],
            "every pod template of the stack names a known namespace, so that none lands in it unchecked (Deployment web names an unknown namespace)",
        ),
        (
            [
                AGENTS,
                node_agent(),
                k8s(POD, "web", {"metadata": {"name": "web"}, "spec": {"containers": []}}),
            ],
            "(Pod web names no namespace)",
        ),
        (
            [
                ns_resource("ray-train", {pods.POD_SECURITY_ENFORCE: "baseline"}),
                k8s(POD, "web", {"spec": {"containers": []}}),
            ],
            None,
        ),
        # AppArmor and SELinux as baseline holds them (Kubernetes "Pod Security Standards").
        (
            [AGENTS, node_agent(containers=[agent_container(appArmorProfile={"type": "Unconfined"})])],
            "container reader sets AppArmor profile type 'Unconfined'",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container(appArmorProfile={"type": UNKNOWN})])],
            "container reader sets AppArmor profile type unknown during preview",
        ),
        (
            [
                AGENTS,
                node_agent(securityContext={"runAsNonRoot": True, "appArmorProfile": {"type": "Unconfined"}}),
            ],
            "the pod sets AppArmor profile type 'Unconfined'",
        ),
        (
            [AGENTS, node_agent(template_metadata={"annotations": {APPARMOR_ANNOTATION: "unconfined"}})],
            f"annotation {APPARMOR_ANNOTATION} is 'unconfined'",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container(seLinuxOptions={"type": "spc_t"})])],
            "container reader sets SELinux type 'spc_t'",
        ),
        (
            [
                AGENTS,
                node_agent(securityContext={"runAsNonRoot": True, "seLinuxOptions": {"user": "system_u"}}),
            ],
            "the pod sets an SELinux user",
        ),
        (
            [AGENTS, node_agent(containers=[agent_container(seLinuxOptions={"role": "system_r"})])],
            "container reader sets an SELinux role",
        ),
        (
            [
                AGENTS,
                node_agent(
                    template_metadata={
                        "annotations": {
                            APPARMOR_ANNOTATION: "localhost/agent",
                            "container.apparmor.security.beta.kubernetes.io/b": "runtime/default",
                        }
                    },
                    securityContext={
                        "runAsNonRoot": True,
                        "appArmorProfile": {"type": "RuntimeDefault"},
                        "seLinuxOptions": {"type": "container_engine_t", "level": "s0:c1,c2"},
                    },
                    containers=[
                        agent_container(
                            appArmorProfile={"type": "Localhost", "localhostProfile": "agent"},
                            seLinuxOptions={"type": "container_t"},
                        )
                    ],
                ),
            ],
            None,
        ),
    ],
)
def test_namespace_pod_security(resources, expected):
    violations = pods.namespace_pod_security.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
        assert violations[0][0] == resources[0].urn


def test_a_bare_host_network_pod_is_told_every_setting_it_lacks():
    """A Pod with `hostNetwork` and no security context runs as root with the runtime's capabilities
    in the node's network namespace: the violation names each thing to change."""
    pod = k8s(
        POD,
        "shell",
        {
            "metadata": {"namespace": "agents"},
            "spec": {"hostNetwork": True, "containers": [{"name": "sh", "image": "repo/ray:2.58.0"}]},
        },
    )
    [(urn, message)] = pods.namespace_pod_security.check([AGENTS, pod])
    assert urn == AGENTS.urn
    assert message.startswith(
        f"label {pods.POD_SECURITY_ENFORCE} is 'privileged': set it to baseline or restricted"
    )
    for fragment in (
        "Pod shell is not a DaemonSet",
        "a pod does not set automountServiceAccountToken: false",
        "container sh does not set runAsNonRoot: true, capabilities.drop: [ALL], readOnlyRootFilesystem: true, allowPrivilegeEscalation: false",
    ):
        assert fragment in message


def test_a_crd_schemas_containers_property_is_no_pod_template():
    """A CRD's schema names `containers` under `properties` (a mapping); a pod spec's is a list."""
    schema = {"properties": {"containers": {"type": "array", "items": {"type": "object"}}}}
    assert pods.pod_templates({"spec": {"versions": [{"schema": {"openAPIV3Schema": schema}}]}}) == []
    pod = {"metadata": {"annotations": {"a": "b"}}, "spec": {"containers": UNKNOWN}}
    assert pods.pod_templates(pod) == [(pod["metadata"], pod["spec"])]


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


RELEASE = "kubernetes:helm.sh/v3:Release"
CHART_V4 = "kubernetes:helm.sh/v4:Chart"
KUBERAY_NS = ns_resource("kuberay", dict(manifests.KUBERAY_POD_SECURITY_LABELS))
UNNAMED_NS = StackResource(NS, "urn:ns-unnamed", {"metadata": {"name": UNKNOWN, "labels": {}}}, ())


def release(namespace=None, dependencies: tuple[str, ...] = (), resource_type: str = RELEASE, **props):
    """A Helm release (or v4 Chart) of the stack into `namespace` (unset when None)."""
    named = {"namespace": namespace} if namespace is not None else {}
    return StackResource(
        resource_type,
        f"urn:pulumi:dev::eks-ray-train::{resource_type}::chart",
        {"chart": "c", **named, **props},
        dependencies,
    )


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([KUBERAY_NS, release("kuberay", createNamespace=False)], None),
        ([release("kube-system")], None),
        ([KUBERAY_NS, release("kuberay", resource_type=CHART_V4)], None),
        ([release(UNKNOWN)], None),
        ([UNNAMED_NS, release("kuberay", dependencies=(UNNAMED_NS.urn,))], None),
        ([KUBERAY_NS, release("kuberay", createNamespace=True)], "createNamespace is true"),
        ([release("kube-system", createNamespace="true")], "createNamespace is true"),
        ([release("kuberay")], "namespace 'kuberay' is not a Namespace of the stack"),
        ([KUBERAY_NS, release("kuberay-system", resource_type=CHART_V4)], "'kuberay-system' is not"),
        ([UNNAMED_NS, release("kuberay")], "install into kube-system"),
        ([KUBERAY_NS, release()], "namespace is not set"),
        ([StackResource(NS, "urn:ns-auto", {"metadata": {}}, ()), release("")], "namespace is not set"),
    ],
)
def test_helm_namespaces_declared(resources, expected):
    violations = pods.helm_namespaces_declared.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
        assert violations[0][0] == resources[-1].urn


def test_a_release_that_creates_an_undeclared_namespace_is_told_both():
    violations = pods.helm_namespaces_declared.check([release("kuberay", createNamespace=True)])
    assert [message.split(":")[0] for _, message in violations] == [
        "createNamespace is true",
        "namespace 'kuberay' is not a Namespace of the stack",
    ]


def test_the_kuberay_operators_namespace_and_release_pass():
    """The program's own Namespace, declared before the release, and the release's namespace."""
    namespace = StackResource(NS, "urn:ns-kuberay", manifests.kuberay_namespace(), ())
    operator = release(manifests.KUBERAY_OPERATOR.namespace, (namespace.urn,), createNamespace=False)
    assert pods.helm_namespaces_declared.check([namespace, operator]) == []
    assert pods.namespace_pod_security.check([namespace, operator]) == []
