"""The pack's rules as plain functions of a resource's properties, plus thin pulumi-policy adapters.

Each rule is a pure function, so tests call it on hand-written property dicts and on every
resource the program registers under mocks, without a Pulumi engine. Properties look the way the
engine shows them to a policy: camelCase names as the provider sees them, nested booleans of
TF-bridged resources often as the strings "true"/"false", and values that depend on resources
not created yet (during `pulumi preview`) as unknown sentinels. A rule never fails on an unknown:
it checks what is known and leaves the rest to the next preview or `pulumi up`.

Resource rules: `check(resource_type, props, stack) -> [violation message, ...]`.
Stack rules: `check([StackResource, ...]) -> [(urn, violation message), ...]`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy import proxy as policy_proxy
from pulumi_policy.deserialize import serialize_properties

MANDATORY = EnforcementLevel.MANDATORY
ADVISORY = EnforcementLevel.ADVISORY

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
AWS_EKS_CLUSTER = "aws:eks/cluster:Cluster"
PULUMI_EKS_CLUSTER = "eks:index:Cluster"
SERVICE = "kubernetes:core/v1:Service"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
BUCKET_VERSIONING = (
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2",
)
VPC = "aws:ec2/vpc:Vpc"
DEFAULT_SECURITY_GROUP = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"

# RAY_PORTS, GPU_NODE_LABEL, the Ray pod labels, `image_pin_problem` and `_quantity` copy the program's `platform_facts`
# and the Kubernetes client's `parse_quantity`: the pack runs in its own virtualenv and cannot import
# them. tests/policy/test_rules.py checks each copy equals the original.
# Ports of the Ray head that must stay inside the cluster: GCS, dashboard (job submission), client.
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
EXTERNAL_SERVICE_TYPES = {"LoadBalancer", "NodePort"}
# The GPU node group is the EFA one: the program labels it so, and only NVIDIA AMIs carry the drivers.
GPU_NODE_LABEL = ("role", "gpu-worker")
# The labels KubeRay puts on a RayCluster's pods (the program's `workloads.manifests`).
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
# The Pod Security admission label that refuses pods, and the levels that refuse privileged ones.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_WARN = "pod-security.kubernetes.io/warn"
POD_SECURITY_AUDIT = "pod-security.kubernetes.io/audit"
ENFORCED_LEVELS = ("baseline", "restricted")
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# The hop limit that keeps instance metadata (and the node role's credentials) from pods.
POD_SAFE_HOP_LIMIT = 1


def control_plane_log_group(cluster_name: str) -> str:
    """Where EKS sends a cluster's control-plane logs; EKS creates it, without retention, if it is missing."""
    return f"/aws/eks/{cluster_name}/cluster"


# During preview the engine replaces values it cannot know yet by these strings (one per kind of value).
UNKNOWN_SENTINELS = frozenset(
    {
        policy_proxy.UNKNOWN_BOOLEAN_VALUE,
        policy_proxy.UNKNOWN_NUMBER_VALUE,
        policy_proxy.UNKNOWN_STRING_VALUE,
        policy_proxy.UNKNOWN_ARRAY_VALUE,
        policy_proxy.UNKNOWN_ASSET_VALUE,
        policy_proxy.UNKNOWN_ARCHIVE_VALUE,
        policy_proxy.UNKNOWN_OBJECT_VALUE,
    }
)


# --- reading properties ---------------------------------------------------------------------------


def is_unknown(value: Any) -> bool:
    """True for a value the engine cannot know during preview."""
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


def _dig(value: Any, *path: str) -> Any:
    """The value at `path` inside nested dicts: None where a step is missing, the sentinel where one is unknown."""
    for key in path:
        if is_unknown(value):
            return value
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _items(value: Any) -> list:
    """A list property's elements; nothing when it is missing or unknown."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def _is_true(value: Any) -> bool:
    """Booleans arrive as bools at the top level and as "true"/"false" strings inside TF-bridged blocks."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _is_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.lower() == "false")


def _type_kind(resource_type: str) -> tuple[str, str]:
    """(API group with version, kind) of a Kubernetes type token, e.g. ("ray.io/v1", "RayCluster")."""
    _, module, kind = ([*resource_type.split(":"), "", ""])[:3]
    return module, kind


def stack_of(urn: str) -> str:
    """The stack name inside a URN (`urn:pulumi:<stack>::<project>::<type>::<name>`)."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")


def is_dev_stack(stack: str) -> bool:
    """Dev stacks are thrown away freely: `dev`, `dev-<anything>`, `<anything>-dev`."""
    return stack == "dev" or stack.startswith("dev-") or stack.endswith("-dev")


def is_gpu_node_group(props: Mapping[str, Any]) -> bool:
    """The EFA GPU node group: labelled role=gpu-worker, or running an NVIDIA (GPU) AMI."""
    key, value = GPU_NODE_LABEL
    ami_type = props.get("amiType")
    labels = props.get("labels")
    labelled = isinstance(labels, Mapping) and labels.get(key) == value
    nvidia_ami = (
        isinstance(ami_type, str)
        and not is_unknown(ami_type)
        and ("NVIDIA" in ami_type or "_GPU" in ami_type)
    )
    return labelled or nvidia_ami


# --- mandatory resource rules -----------------------------------------------------------------------


def check_nodes_without_public_ips(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """No launch template, subnet or pulumi-eks node setting may hand a node a public IP address."""
    violations = []
    if resource_type == LAUNCH_TEMPLATE:
        for index, interface in enumerate(_items(props.get("networkInterfaces"))):
            if _is_true(_dig(interface, "associatePublicIpAddress")):
                violations.append(
                    f"networkInterfaces[{index}].associatePublicIpAddress is true: nodes must have no public IP; "
                    "set it to false (they reach the internet through the NAT gateway)"
                )
    elif resource_type == SUBNET:
        if _is_true(props.get("mapPublicIpOnLaunch")):
            violations.append(
                "mapPublicIpOnLaunch is true: every instance launched in this subnet gets a public IP; set it to false"
            )
    elif resource_type.startswith("eks:index:") and _is_true(props.get("nodeAssociatePublicIpAddress")):
        violations.append("nodeAssociatePublicIpAddress is true: set it to false so nodes get no public IP")
    return violations


def check_imdsv2_required(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Instance metadata only through IMDSv2 sessions, on every launch template and so on every node.

    A managed node group without a launch template gets EKS's own, whose metadata options this
    pack cannot see, so it has to bring one.
    """
    if resource_type == LAUNCH_TEMPLATE:
        options = props.get("metadataOptions")
        if is_unknown(options):
            return []
        endpoint, tokens = _dig(options, "httpEndpoint"), _dig(options, "httpTokens")
        if endpoint == "disabled" or is_unknown(tokens) or tokens == "required":
            return []
        current = "not set" if tokens is None else repr(tokens)
        return [
            f"metadataOptions.httpTokens is {current}: require IMDSv2 with "
            "metadata_options={'http_tokens': 'required', 'http_endpoint': 'enabled'}"
        ]
    if resource_type == NODE_GROUP and props.get("launchTemplate") is None:
        return [
            "the node group has no launch template: give it one whose metadataOptions.httpTokens is 'required'"
        ]
    return []


def check_metadata_hop_limit(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Instance metadata answers the node only: with a hop limit of 1 the response dies at a pod's extra hop.

    Unset, the AMI decides, and AMIs registered for IMDSv2 (the EKS AL2023 ones) default to 2,
    which lets every pod read the node role's credentials.
    """
    if resource_type != LAUNCH_TEMPLATE:
        return []
    options = props.get("metadataOptions")
    if is_unknown(options) or _dig(options, "httpEndpoint") == "disabled":
        return []
    limit = _dig(options, "httpPutResponseHopLimit")
    if is_unknown(limit) or (isinstance(limit, (int, float, str)) and str(limit) in ("1", "1.0")):
        return []
    current = "not set (the AMI's default, 2 on EKS AL2023 AMIs)" if limit is None else f"{limit}"
    return [
        f"metadataOptions.httpPutResponseHopLimit is {current}: set it to {POD_SAFE_HOP_LIMIT} so pods cannot read "
        "the node role's credentials (pods get theirs from IRSA)"
    ]


def check_eks_secrets_encrypted(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Kubernetes secrets of the cluster are envelope-encrypted with a KMS key."""
    if resource_type == PULUMI_EKS_CLUSTER:
        if props.get("encryptionConfigKeyArn") in (None, ""):
            return [
                "encryptionConfigKeyArn is not set: pass a KMS key ARN so Kubernetes secrets are encrypted"
            ]
    elif resource_type == AWS_EKS_CLUSTER:
        config = props.get("encryptionConfig")
        if is_unknown(config):
            return []
        resources = _dig(config, "resources")
        key_arn = _dig(config, "provider", "keyArn")
        if (
            config is None
            or key_arn in (None, "")
            or not (is_unknown(resources) or "secrets" in _items(resources))
        ):
            return ["encryptionConfig must name a KMS key (provider.keyArn) for resources ['secrets']"]
    return []


def _internet_wide(cidrs: Any) -> list[str]:
    """ "0.0.0.0/0" and/or "::/0" when the known blocks of the list, together, admit every address."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for block in _items(cidrs):
        if is_unknown(block):
            continue
        try:
            network = ipaddress.ip_network(str(block), strict=False)
        except ValueError:
            continue
        if isinstance(network, ipaddress.IPv4Network):
            v4.append(network)
        else:
            v6.append(network)
    everything = []
    if any(merged.prefixlen == 0 for merged in ipaddress.collapse_addresses(v4)):
        everything.append("0.0.0.0/0")
    if any(merged.prefixlen == 0 for merged in ipaddress.collapse_addresses(v6)):
        everything.append("::/0")
    return everything


def check_eks_api_not_open(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A public API endpoint admits only listed addresses; EKS's default list is 0.0.0.0/0."""
    if resource_type == PULUMI_EKS_CLUSTER:
        public, cidrs, where = props.get("endpointPublicAccess"), props.get("publicAccessCidrs"), ""
    elif resource_type == AWS_EKS_CLUSTER:
        vpc_config = props.get("vpcConfig")
        if is_unknown(vpc_config):
            return []
        public = _dig(vpc_config, "endpointPublicAccess")
        cidrs = _dig(vpc_config, "publicAccessCidrs")
        where = "vpcConfig."
    else:
        return []
    if _is_false(public) or is_unknown(public) or is_unknown(cidrs):
        return []
    if not _items(cidrs):
        return [
            f"{where}endpointPublicAccess is on and {where}publicAccessCidrs is empty, which EKS reads as 0.0.0.0/0: "
            "list your own addresses (config endpointPublicAccessCidrs) or turn the public endpoint off"
        ]
    return [
        f"{where}publicAccessCidrs cover {everything}: the Kubernetes API would be open to the whole internet; "
        "list only your own addresses"
        for everything in _internet_wide(cidrs)
    ]


def check_gpu_node_group_single_subnet(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """EFA traffic cannot cross availability zones, so the GPU nodes share one subnet."""
    if resource_type != NODE_GROUP or not is_gpu_node_group(props):
        return []
    subnets = props.get("subnetIds")
    if is_unknown(subnets):
        return []
    count = len(_items(subnets))
    if count != 1:
        return [
            f"the GPU node group has {count} subnets: EFA works within one AZ, so give it exactly one subnet"
        ]
    return []


def _ray_cluster_spec(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The RayCluster spec inside a KubeRay RayCluster, RayJob or RayService; None for anything else."""
    module, kind = _type_kind(resource_type)
    if not module.startswith("ray.io/"):
        return None
    spec = props.get("spec")
    inner = {
        "RayCluster": spec,
        "RayJob": _dig(spec, "rayClusterSpec"),
        "RayService": _dig(spec, "rayClusterConfig"),
    }
    found = inner.get(kind)
    return found if isinstance(found, Mapping) else None


def _ray_port_in(port: Mapping[str, Any]) -> int | str | None:
    """The Ray port a Service port forwards (by number or container port name), if any."""
    for value in (_dig(port, "port"), _dig(port, "targetPort")):
        if isinstance(value, str) and value in RAY_PORTS:
            return value
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        # Numbers reach a policy as floats (JSON through protobuf).
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in RAY_PORTS.values():
            return int(value)
    return None


def check_ray_ports_not_exposed(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Ray's GCS, dashboard and client ports accept jobs without authentication: cluster-internal only."""
    violations = []
    if resource_type == SERVICE:
        service_type = _dig(props, "spec", "type")
        if service_type in EXTERNAL_SERVICE_TYPES:
            exposed = sorted(
                {str(p) for p in map(_ray_port_in, _items(_dig(props, "spec", "ports"))) if p is not None}
            )
            if exposed:
                violations.append(
                    f"a {service_type} Service exposes Ray port(s) {', '.join(exposed)} outside the cluster: "
                    "use ClusterIP and `kubectl port-forward`"
                )
    spec = _ray_cluster_spec(resource_type, props)
    if spec is not None:
        head = spec.get("headGroupSpec")
        for where, value in (
            ("headGroupSpec.serviceType", _dig(head, "serviceType")),
            ("headGroupSpec.headService.spec.type", _dig(head, "headService", "spec", "type")),
        ):
            if value in EXTERNAL_SERVICE_TYPES:
                violations.append(
                    f"{where} is {value}: the head Service would expose the Ray dashboard and GCS outside the cluster; "
                    "use ClusterIP and `kubectl port-forward`"
                )
    return violations


_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")
_QUANTITY_FACTORS = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def _quantity(value: Any) -> Decimal | str:
    """A Kubernetes quantity as a number (so "40" equals 40 and "1Gi" equals "1024Mi"); else its text."""
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match:
        return Decimal(match.group(1)) * _QUANTITY_FACTORS[match.group(2)]
    try:
        return Decimal(text)  # decimal exponent form, e.g. 1e3
    except InvalidOperation:
        return text


def _container_resource_gaps(container: Mapping[str, Any]) -> list[str]:
    """Why a container is not QoS Guaranteed: a resource whose effective request differs from its limit.

    Kubernetes fills a missing request from the limit, so only limits are required; CPU and memory
    limits are, because without them the pod is not Guaranteed whatever else it sets.
    """
    resources = _dig(container, "resources")
    if is_unknown(resources):
        return []
    requests, limits = _dig(resources, "requests"), _dig(resources, "limits")
    if is_unknown(requests) or is_unknown(limits):
        return []
    requests = requests if isinstance(requests, Mapping) else {}
    limits = limits if isinstance(limits, Mapping) else {}
    gaps = [f"no {name} limit" for name in ("cpu", "memory") if name not in limits]
    for name in sorted(set(requests) | set(limits)):
        request, limit = requests.get(name, limits.get(name)), limits.get(name)
        if is_unknown(request) or is_unknown(limit):
            continue
        if limit is None:
            gaps.append(f"{name} requested ({request}) without a limit")
        elif _quantity(request) != _quantity(limit):
            gaps.append(f"{name} request {request} != limit {limit}")
    return gaps


def check_ray_workers_guaranteed(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Ray worker containers request exactly their limits, so each pod owns its node's GPUs, EFA, CPU, memory."""
    spec = _ray_cluster_spec(resource_type, props)
    if spec is None:
        return []
    violations = []
    for group_index, group in enumerate(_items(spec.get("workerGroupSpecs"))):
        group_name = _dig(group, "groupName")
        label = (
            group_name if isinstance(group_name, str) and not is_unknown(group_name) else f"#{group_index}"
        )
        for container in _items(_dig(group, "template", "spec", "containers")):
            gaps = _container_resource_gaps(container)
            if gaps:
                violations.append(
                    f"worker group {label}, container {_dig(container, 'name')}: {'; '.join(gaps)}. "
                    "Set requests equal to limits (QoS Guaranteed)"
                )
    return violations


def _pod_specs_containers(value: Any) -> list[Mapping[str, Any]]:
    """Every container of every pod template anywhere inside a Kubernetes object (Pods, workloads, Ray CRs)."""
    found: list[Mapping[str, Any]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("containers", "initContainers", "ephemeralContainers"):
                found.extend(c for c in _items(item) if isinstance(c, Mapping))
            else:
                found.extend(_pod_specs_containers(item))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            found.extend(_pod_specs_containers(item))
    return found


# What follows `@` in a digest reference: `<algorithm>:<hex>` (OCI image spec, descriptor digests).
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


def image_pin_problem(image: str) -> str | None:
    """Why an image reference is not pinned (no tag, or `latest`), or None when it has a tag or digest."""
    name, at, digest = image.partition("@")
    if at:
        return None if _DIGEST.fullmatch(digest) else "has a malformed digest"
    last_segment = name.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return "has no tag (so it means latest)"
    if last_segment.rsplit(":", 1)[1] == "latest":
        return "is tagged latest"
    return None


def check_container_images_pinned(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Containers run a fixed image: a tag other than latest, or a digest, so every node runs the same bits."""
    if not resource_type.startswith("kubernetes:"):
        return []
    violations = []
    for container in _pod_specs_containers(props):
        image = container.get("image")
        if not isinstance(image, str) or is_unknown(image):
            continue
        problem = image_pin_problem(image)
        if problem:
            violations.append(
                f"container {container.get('name')}: image {image} {problem}; pin a version tag or an @sha256 digest"
            )
    return violations


# --- advisory resource rules -------------------------------------------------------------------------


def check_log_groups_kms_encrypted(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Log groups are encrypted with a customer-managed KMS key, so reading them needs that key too."""
    if resource_type != LOG_GROUP:
        return []
    key = props.get("kmsKeyId")
    if is_unknown(key) or (isinstance(key, str) and key):
        return []
    return ["the log group has no kmsKeyId: encrypt it with a KMS key whose policy admits CloudWatch Logs"]


def check_control_plane_logging(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """All five control-plane log types go to CloudWatch, so API calls and auth decisions can be audited."""
    if resource_type not in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER):
        return []
    enabled = props.get("enabledClusterLogTypes")
    if is_unknown(enabled):
        return []
    missing = [log for log in CONTROL_PLANE_LOG_TYPES if log not in _items(enabled)]
    if missing:
        return [f"control-plane logs off for {', '.join(missing)}: add them to enabledClusterLogTypes"]
    return []


def check_deletion_protection(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Outside dev stacks the cluster is protected from an accidental `pulumi destroy` or console delete."""
    if resource_type not in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER) or is_dev_stack(stack):
        return []
    protection = props.get("deletionProtection")
    if _is_true(protection) or is_unknown(protection):
        return []
    return [f"stack {stack} is not a dev stack: set deletionProtection on the EKS cluster"]


# --- the stack rule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackResource:
    """What a stack rule needs of a resource: its properties and the URNs it depends on."""

    type: str
    urn: str
    props: Mapping[str, Any]
    dependencies: tuple[str, ...]


def _has_efa_interface(template: StackResource) -> bool | None:
    """True/False when known; None while the interfaces are unknown."""
    interfaces = template.props.get("networkInterfaces")
    if is_unknown(interfaces):
        return None
    kinds = [_dig(interface, "interfaceType") for interface in _items(interfaces)]
    if any(is_unknown(kind) for kind in kinds) and "efa" not in kinds:
        return None
    return "efa" in kinds


def _launch_templates_of(
    node_group: StackResource, resources: Sequence[StackResource]
) -> list[StackResource]:
    """The launch templates a node group may use: by known id or name, else those it depends on.

    During a first preview the template's id is unknown, so the dependency is what links them.
    """
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    reference = node_group.props.get("launchTemplate")
    for key in ("id", "name"):
        wanted = _dig(reference, key)
        if isinstance(wanted, str) and wanted and not is_unknown(wanted):
            matched = [t for t in templates if t.props.get(key) == wanted]
            if matched:
                return matched
    return [t for t in templates if t.urn in node_group.dependencies]


def check_gpu_node_group_efa(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """The GPU node group's launch template gives each node an EFA interface (interfaceType "efa")."""
    violations = []
    for group in resources:
        if group.type != NODE_GROUP or not is_gpu_node_group(group.props):
            continue
        reference = group.props.get("launchTemplate")
        if reference is None:
            violations.append(
                (group.urn, "the GPU node group has no launch template, so its nodes get no EFA interface")
            )
            continue
        if is_unknown(reference):
            continue
        templates = _launch_templates_of(group, resources)
        if not templates:
            violations.append(
                (
                    group.urn,
                    "the GPU node group's launch template is not in this stack, so its EFA interface cannot be checked",
                )
            )
            continue
        verdicts = [_has_efa_interface(template) for template in templates]
        if True not in verdicts and None not in verdicts:
            violations.append(
                (
                    group.urn,
                    "the GPU node group's launch template has no network interface with interfaceType 'efa': "
                    "NCCL would fall back to TCP",
                )
            )
    return violations


def _linked(
    resource: StackResource, name_key: str, others: Sequence[StackResource], reference_key: str
) -> list:
    """`others` that point at `resource`: by its known name or id, else by depending on it (first preview)."""
    names = {
        value
        for value in (resource.props.get(name_key), resource.props.get("id"))
        if isinstance(value, str) and value and not is_unknown(value)
    }
    return [
        other
        for other in others
        if resource.urn in other.dependencies or other.props.get(reference_key) in names
    ]


def denies_plain_http(policy: Any) -> bool | None:
    """Whether a bucket policy denies every S3 action on the bucket and its objects without TLS; None if unknown.

    The S3 user guide's form: Deny, any principal, `s3:*`, the bucket and `bucket/*`, when
    `aws:SecureTransport` is "false".
    """
    if is_unknown(policy):
        return None
    try:
        document = json.loads(policy) if isinstance(policy, str) else policy
    except ValueError:
        return False
    statements = _dig(document, "Statement")
    for statement in [statements] if isinstance(statements, Mapping) else _items(statements):
        actions = _dig(statement, "Action")
        resources = _dig(statement, "Resource")
        resources = [resources] if isinstance(resources, str) else _items(resources)
        principal = _dig(statement, "Principal")
        secure = _dig(statement, "Condition", "Bool", "aws:SecureTransport")
        if (
            _dig(statement, "Effect") == "Deny"
            and principal in ("*", {"AWS": "*"})
            and {"s3:*", "*"} & set([actions] if isinstance(actions, str) else _items(actions))
            and any(str(r).endswith("/*") for r in resources)
            and any(not str(r).endswith("/*") for r in resources)
            and (_is_false(secure) or _items(secure) in (["false"], [False]))
        ):
            return True
    return False


def check_buckets_tls_only(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every bucket has a policy that refuses requests without TLS (`aws:SecureTransport` false)."""
    policies = [r for r in resources if r.type == BUCKET_POLICY]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        verdicts = [
            denies_plain_http(p.props.get("policy")) for p in _linked(bucket, "bucket", policies, "bucket")
        ]
        if True in verdicts or None in verdicts:
            continue
        problem = (
            "has no bucket policy" if not verdicts else "has a bucket policy that does not deny plain HTTP"
        )
        violations.append(
            (
                bucket.urn,
                f"the bucket {problem}: add a statement denying s3:* on the bucket and bucket/* when "
                "aws:SecureTransport is false",
            )
        )
    return violations


def check_log_retention(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Logs do not pile up forever: every log group has a retention, including the EKS control plane's.

    EKS writes control-plane logs to `/aws/eks/<cluster>/cluster` and creates that group, with no
    retention, when the stack does not; so a cluster with logs on needs the group in the stack.
    """
    violations = []
    groups = [r for r in resources if r.type == LOG_GROUP]
    for group in groups:
        retention = group.props.get("retentionInDays")
        if retention is None or (not is_unknown(retention) and not retention):
            violations.append(
                (group.urn, "the log group has no retentionInDays, so CloudWatch keeps its logs forever")
            )
    names = {g.props.get("name") for g in groups}
    for cluster in (r for r in resources if r.type in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER)):
        name, logs = cluster.props.get("name"), cluster.props.get("enabledClusterLogTypes")
        if not isinstance(name, str) or is_unknown(name) or is_unknown(logs) or not _items(logs):
            continue
        if control_plane_log_group(name) not in names and not any(is_unknown(n) for n in names):
            violations.append(
                (
                    cluster.urn,
                    f"control-plane logs go to {control_plane_log_group(name)}, which is not in the stack: EKS "
                    "would create it without retention; create it with retentionInDays before the cluster",
                )
            )
    return violations


def check_buckets_versioned(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every bucket keeps object versions, so an overwritten or deleted object can be recovered."""
    configs = [r for r in resources if r.type in BUCKET_VERSIONING]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        statuses = [
            _dig(c.props, "versioningConfiguration", "status")
            for c in _linked(bucket, "bucket", configs, "bucket")
        ]
        if _is_true(_dig(bucket.props, "versioning", "enabled")):
            continue
        if "Enabled" in statuses or any(is_unknown(status) for status in statuses):
            continue
        violations.append(
            (bucket.urn, "the bucket does not keep versions: add a BucketVersioning with status Enabled")
        )
    return violations


def check_default_security_group_closed(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Each VPC's default security group is taken over and emptied of rules (AWS's default admits all
    traffic among its members and out)."""
    groups = [r for r in resources if r.type == DEFAULT_SECURITY_GROUP]
    violations = []
    for vpc in (r for r in resources if r.type == VPC):
        linked = _linked(vpc, "id", groups, "vpcId")
        if not linked:
            violations.append(
                (
                    vpc.urn,
                    "the VPC's default security group keeps AWS's rules: manage it with a "
                    "DefaultSecurityGroup without ingress or egress",
                )
            )
        for group in linked:
            rules = [key for key in ("ingress", "egress") if _items(group.props.get(key))]
            if rules:
                violations.append(
                    (group.urn, f"the default security group has {' and '.join(rules)} rules: remove them")
                )
    return violations


def _selects_head(policy: StackResource, cluster_name: str, namespace: Any) -> bool | None:
    """Whether a NetworkPolicy isolates a RayCluster's head pods for ingress; None while unknown."""
    spec = policy.props.get("spec")
    where = _dig(policy.props, "metadata", "namespace")
    match = _dig(spec, "podSelector", "matchLabels")
    types = _dig(spec, "policyTypes")
    if any(is_unknown(value) for value in (spec, where, match, types)):
        return None
    head = {RAY_CLUSTER_LABEL: cluster_name, RAY_NODE_TYPE_LABEL: "head"}
    match = match if isinstance(match, Mapping) else {}
    open_rule = any(_dig(rule, "from") is None for rule in _items(_dig(spec, "ingress")))
    return (
        where == namespace and match.items() <= head.items() and "Ingress" in _items(types) and not open_rule
    )


def _pod_specs(value: Any) -> list[Mapping[str, Any]]:
    """Every pod spec (a mapping with `containers`) anywhere inside a Kubernetes object."""
    if isinstance(value, Mapping):
        own = [value] if "containers" in value else []
        return own + [spec for item in value.values() for spec in _pod_specs(item)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [spec for item in value for spec in _pod_specs(item)]
    return []


def beyond_host_network(spec: Mapping[str, Any]) -> list[str]:
    """What a pod spec asks for that Pod Security `baseline` refuses, other than `hostNetwork`
    (Kubernetes "Pod Security Standards", baseline: host PID/IPC, host paths and ports, privileged
    containers, added capabilities, unconfined seccomp, proc mount, sysctls)."""
    found = [f"{key}: true" for key in ("hostPID", "hostIPC") if _is_true(spec.get(key))]
    found += [
        f"volume {v.get('name')} is a hostPath"
        for v in _items(spec.get("volumes"))
        if isinstance(v, Mapping) and "hostPath" in v
    ]
    if _items(_dig(spec, "securityContext", "sysctls")):
        found.append("sysctls")
    if _dig(spec, "securityContext", "seccompProfile", "type") == "Unconfined":
        found.append("an unconfined seccomp profile")
    for container in _pod_specs_containers(spec):
        name, context = container.get("name"), container.get("securityContext") or {}
        if _is_true(_dig(context, "privileged")):
            found.append(f"container {name} is privileged")
        if _items(_dig(context, "capabilities", "add")):
            found.append(f"container {name} adds capabilities")
        if _dig(context, "procMount") not in (None, "Default"):
            found.append(f"container {name} mounts /proc unmasked")
        if _dig(context, "seccompProfile", "type") == "Unconfined":
            found.append(f"container {name} runs without seccomp")
        if any(isinstance(port, Mapping) and port.get("hostPort") for port in _items(container.get("ports"))):
            found.append(f"container {name} takes a host port")
    return found


def check_namespace_pod_security(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every namespace the stack creates refuses privileged pods (Pod Security `baseline` or stricter).

    The one exception is a namespace for pods that need the host's network namespace (a node agent
    such as an EFA counter reader, which `baseline` refuses): it may enforce `privileged` when it
    still warns and audits at `baseline` or stricter, so any other pod admitted there is flagged, and
    the stack puts pods there that ask for nothing beyond `hostNetwork` (`beyond_host_network`)."""
    violations = []
    for namespace in (r for r in resources if r.type == NAMESPACE):
        labels = _dig(namespace.props, "metadata", "labels")
        name = _dig(namespace.props, "metadata", "name")
        if is_unknown(labels) or is_unknown(name):
            continue
        level = _dig(labels, POD_SECURITY_ENFORCE)
        if is_unknown(level) or level in ENFORCED_LEVELS:
            continue
        current = "not set" if level is None else repr(level)
        refusal = (
            f"label {POD_SECURITY_ENFORCE} is {current}: set it to baseline or restricted so the namespace "
            "refuses privileged pods, host namespaces and host paths"
        )
        if level != "privileged":
            violations.append((namespace.urn, refusal))
            continue
        problems = _host_network_namespace_problems(resources, labels, name)
        if problems:
            violations.append(
                (
                    namespace.urn,
                    f"{refusal}; a namespace for host-network pods may enforce privileged only when "
                    + "; ".join(problems),
                )
            )
    return violations


def _host_network_namespace_problems(
    resources: Sequence[StackResource], labels: Mapping[str, Any], name: str
) -> list[str]:
    """Why a `privileged` namespace is not one for host-network pods alone (empty: it is)."""
    problems = [
        f"it {label.rsplit('/', 1)[1]}s at baseline or restricted (label {label} is {_dig(labels, label)!r})"
        for label in (POD_SECURITY_WARN, POD_SECURITY_AUDIT)
        if _dig(labels, label) not in ENFORCED_LEVELS
    ]
    pods = [
        spec
        for resource in resources
        if resource.type.startswith("kubernetes:") and _dig(resource.props, "metadata", "namespace") == name
        for spec in _pod_specs(resource.props)
    ]
    if not pods:
        problems.append("the stack puts host-network pods in it (it puts none)")
    for spec in pods:
        if not _is_true(spec.get("hostNetwork")):
            problems.append("each of its pods uses the host's network (one does not)")
        problems += [f"its pods ask for nothing else ({found})" for found in beyond_host_network(spec)]
    return problems


def check_ray_head_network_policy(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """A RayCluster's head, whose GCS, dashboard and client ports take jobs without authentication, is
    isolated for ingress by a NetworkPolicy in its namespace that admits only listed peers."""
    policies = [r for r in resources if r.type == NETWORK_POLICY]
    violations = []
    for cluster in (r for r in resources if r.type == RAY_CLUSTER):
        name, namespace = (_dig(cluster.props, "metadata", key) for key in ("name", "namespace"))
        if not isinstance(name, str) or is_unknown(name) or is_unknown(namespace):
            continue
        verdicts = [_selects_head(policy, name, namespace) for policy in policies]
        if True in verdicts or None in verdicts:
            continue
        violations.append(
            (
                cluster.urn,
                f"no NetworkPolicy in namespace {namespace} isolates the head of RayCluster {name} "
                f"({RAY_CLUSTER_LABEL}={name}, {RAY_NODE_TYPE_LABEL}=head) for ingress with rules that name "
                "their peers: any pod of the cluster can reach Ray's ports",
            )
        )
    return violations


# --- metadata and pulumi-policy adapters -------------------------------------------------------------


def plain(props: Any) -> Any:
    """Plain dicts and lists from pulumi-policy's unknown-checking proxies, unknowns left as sentinels.

    The proxies raise on reading an unknown value; the rules would rather see it and skip it.
    """
    return serialize_properties(props)


@dataclass(frozen=True)
class ResourceRule:
    """A rule applied to each resource on its own."""

    name: str
    description: str
    enforcement: EnforcementLevel
    check: Callable[[str, Mapping[str, Any], str], list[str]]

    def to_policy(self) -> ResourceValidationPolicy:
        def validate(args: ResourceValidationArgs, report_violation) -> None:
            for message in self.check(args.resource_type, plain(args.props), stack_of(args.urn)):
                report_violation(message, None)

        return ResourceValidationPolicy(
            name=self.name,
            description=self.description,
            enforcement_level=self.enforcement,
            validate=validate,
        )


@dataclass(frozen=True)
class StackRule:
    """A rule that needs several resources at once (a node group and its launch template)."""

    name: str
    description: str
    enforcement: EnforcementLevel
    check: Callable[[Sequence[StackResource]], list[tuple[str, str]]]

    def to_policy(self) -> StackValidationPolicy:
        def validate(args: StackValidationArgs, report_violation) -> None:
            resources = [
                StackResource(
                    type=resource.resource_type,
                    urn=resource.urn,
                    props=plain(resource.props),
                    dependencies=tuple(
                        {dep.urn for dep in resource.dependencies}
                        | {dep.urn for deps in resource.property_dependencies.values() for dep in deps}
                    ),
                )
                for resource in args.resources
            ]
            for urn, message in self.check(resources):
                report_violation(message, urn)

        return StackValidationPolicy(
            name=self.name,
            description=self.description,
            enforcement_level=self.enforcement,
            validate=validate,
        )


NODES_WITHOUT_PUBLIC_IPS = ResourceRule(
    "nodes-without-public-ips",
    "Nodes get no public IP: not from a launch template, a subnet, or pulumi-eks settings.",
    MANDATORY,
    check_nodes_without_public_ips,
)
IMDSV2_REQUIRED = ResourceRule(
    "imdsv2-required",
    "Every launch template requires IMDSv2 (httpTokens: required); every managed node group has one.",
    MANDATORY,
    check_imdsv2_required,
)
METADATA_HOP_LIMIT = ResourceRule(
    "metadata-hop-limit-1",
    "Every launch template sets the instance metadata hop limit to 1, keeping node credentials from pods.",
    MANDATORY,
    check_metadata_hop_limit,
)
BUCKETS_TLS_ONLY = StackRule(
    "s3-buckets-tls-only",
    "Every S3 bucket has a policy denying requests without TLS (aws:SecureTransport false).",
    MANDATORY,
    check_buckets_tls_only,
)
LOG_RETENTION = StackRule(
    "log-retention-set",
    "Every CloudWatch log group, the EKS control plane's included, has a retention.",
    MANDATORY,
    check_log_retention,
)
EKS_SECRETS_ENCRYPTED = ResourceRule(
    "eks-secrets-kms-encrypted",
    "EKS encrypts Kubernetes secrets with a KMS key.",
    MANDATORY,
    check_eks_secrets_encrypted,
)
EKS_API_NOT_OPEN = ResourceRule(
    "eks-api-not-open-to-internet",
    "A public EKS API endpoint admits listed CIDRs only, never 0.0.0.0/0.",
    MANDATORY,
    check_eks_api_not_open,
)
GPU_NODE_GROUP_SINGLE_SUBNET = ResourceRule(
    "gpu-node-group-single-subnet",
    "The GPU node group sits in exactly one subnet (EFA does not cross availability zones).",
    MANDATORY,
    check_gpu_node_group_single_subnet,
)
GPU_NODE_GROUP_EFA = StackRule(
    "gpu-node-group-efa-interface",
    "The GPU node group's launch template has an EFA network interface.",
    MANDATORY,
    check_gpu_node_group_efa,
)
RAY_PORTS_NOT_EXPOSED = ResourceRule(
    "ray-ports-not-exposed",
    "No LoadBalancer or NodePort Service for Ray's GCS (6379), dashboard (8265) or client (10001) ports.",
    MANDATORY,
    check_ray_ports_not_exposed,
)
RAY_WORKERS_GUARANTEED = ResourceRule(
    "ray-worker-requests-equal-limits",
    "Ray worker containers request exactly their limits (QoS Guaranteed).",
    MANDATORY,
    check_ray_workers_guaranteed,
)
CONTAINER_IMAGES_PINNED = ResourceRule(
    "container-images-pinned",
    "Container images are pinned to a tag (not latest) or a digest.",
    MANDATORY,
    check_container_images_pinned,
)
NAMESPACE_POD_SECURITY = StackRule(
    "namespace-pod-security-enforced",
    "Every namespace enforces the baseline or restricted Pod Security Standard, but one for host-network "
    "pods alone, which warns and audits at baseline.",
    MANDATORY,
    check_namespace_pod_security,
)
BUCKETS_VERSIONED = StackRule(
    "s3-buckets-versioned",
    "Every S3 bucket keeps object versions.",
    MANDATORY,
    check_buckets_versioned,
)
DEFAULT_SECURITY_GROUP_CLOSED = StackRule(
    "vpc-default-security-group-closed",
    "Every VPC's default security group is managed by the stack and has no rules.",
    MANDATORY,
    check_default_security_group_closed,
)
RAY_HEAD_NETWORK_POLICY = StackRule(
    "ray-head-network-policy",
    "Every RayCluster's head is isolated for ingress by a NetworkPolicy naming its peers.",
    MANDATORY,
    check_ray_head_network_policy,
)
LOG_GROUPS_KMS_ENCRYPTED = ResourceRule(
    "log-groups-kms-encrypted",
    "CloudWatch log groups are encrypted with a customer-managed KMS key.",
    ADVISORY,
    check_log_groups_kms_encrypted,
)
CONTROL_PLANE_LOGGING = ResourceRule(
    "eks-control-plane-logging",
    "EKS sends all five control-plane log types to CloudWatch.",
    ADVISORY,
    check_control_plane_logging,
)
DELETION_PROTECTION = ResourceRule(
    "eks-deletion-protection",
    "EKS clusters of non-dev stacks have deletion protection on.",
    ADVISORY,
    check_deletion_protection,
)
