"""The nodes: instance metadata only through IMDSv2 and only to the node, a node role with no more
than a node needs, the GPU node group in one subnet with an EFA interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    LAUNCH_TEMPLATE,
    NODE_GROUP,
    ROLE,
    ROLE_POLICY_ATTACHMENT,
    StackResource,
    as_list,
    dig,
    is_unknown,
    items,
    linked,
    policy_statements,
)
from .registry import MANDATORY, resource_rule, stack_rule

# The GPU node group is the EFA one: the program labels it so, and only NVIDIA AMIs carry the drivers.
GPU_NODE_LABEL = ("role", "gpu-worker")

# The hop limit that keeps instance metadata (and the node role's credentials) from pods.
POD_SAFE_HOP_LIMIT = 1

# AWS managed policies a node role must not hold, and what to do instead (EKS user guide, "Amazon EKS
# node IAM role"): every host-network pod reads the node role's credentials from IMDS.
NODE_ROLE_FORBIDDEN = {
    "policy/AmazonEKS_CNI_Policy": "give the VPC CNI a role of its own (IRSA for kube-system:aws-node, "
    "the vpc-cni add-on's serviceAccountRoleArn)",
    "policy/AmazonEC2ContainerRegistryReadOnly": "attach AmazonEC2ContainerRegistryPullOnly instead, "
    "which pulls images without listing or describing the account's repositories",
}


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


@resource_rule(
    "imdsv2-required",
    MANDATORY,
    description="Every launch template requires IMDSv2 (httpTokens: required); every managed node group has one.",
    resources="launch templates, managed node groups",
    requires="`metadataOptions.httpTokens: required` (or the metadata endpoint disabled); every managed node group brings a launch template, since EKS's default one is not visible to the pack",
)
def imdsv2_required(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Instance metadata only through IMDSv2 sessions, on every launch template and so on every node.

    A managed node group without a launch template gets EKS's own, whose metadata options this
    pack cannot see, so it has to bring one.
    """
    if resource_type == LAUNCH_TEMPLATE:
        options = props.get("metadataOptions")
        if is_unknown(options):
            return []
        endpoint, tokens = dig(options, "httpEndpoint"), dig(options, "httpTokens")
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


@resource_rule(
    "metadata-hop-limit-1",
    MANDATORY,
    description=f"Every launch template sets the instance metadata hop limit to {POD_SAFE_HOP_LIMIT}, keeping node credentials from pods.",
    resources="launch templates",
    requires=f"`metadataOptions.httpPutResponseHopLimit: {POD_SAFE_HOP_LIMIT}` (or the metadata endpoint disabled): the metadata response does not reach pods, so they cannot use the node role's credentials; unset means the AMI's default, 2 on EKS AL2023 AMIs",
)
def metadata_hop_limit(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Instance metadata answers the node only: with a hop limit of 1 the response dies at a pod's extra hop.

    Unset, the AMI decides, and AMIs registered for IMDSv2 (the EKS AL2023 ones) default to 2,
    which lets every pod read the node role's credentials.
    """
    if resource_type != LAUNCH_TEMPLATE:
        return []
    options = props.get("metadataOptions")
    if is_unknown(options) or dig(options, "httpEndpoint") == "disabled":
        return []
    limit = dig(options, "httpPutResponseHopLimit")
    if is_unknown(limit) or (isinstance(limit, (int, float, str)) and str(limit) in ("1", "1.0")):
        return []
    current = "not set (the AMI's default, 2 on EKS AL2023 AMIs)" if limit is None else f"{limit}"
    return [
        f"metadataOptions.httpPutResponseHopLimit is {current}: set it to {POD_SAFE_HOP_LIMIT} so pods cannot read "
        "the node role's credentials (pods get theirs from IRSA)"
    ]


@resource_rule(
    "gpu-node-group-single-subnet",
    MANDATORY,
    description="The GPU node group sits in exactly one subnet (EFA does not cross availability zones).",
    resources="the GPU node group (label `role=gpu-worker` or an NVIDIA AMI type)",
    requires="exactly one subnet: EFA traffic does not cross availability zones",
)
def gpu_node_group_single_subnet(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """EFA traffic cannot cross availability zones, so the GPU nodes share one subnet."""
    if resource_type != NODE_GROUP or not is_gpu_node_group(props):
        return []
    subnets = props.get("subnetIds")
    if is_unknown(subnets):
        return []
    count = len(items(subnets))
    if count != 1:
        return [
            f"the GPU node group has {count} subnets: EFA works within one AZ, so give it exactly one subnet"
        ]
    return []


def _has_efa_interface(template: StackResource) -> bool | None:
    """True/False when known; None while the interfaces are unknown."""
    interfaces = template.props.get("networkInterfaces")
    if is_unknown(interfaces):
        return None
    kinds = [dig(interface, "interfaceType") for interface in items(interfaces)]
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
        wanted = dig(reference, key)
        if isinstance(wanted, str) and wanted and not is_unknown(wanted):
            matched = [t for t in templates if t.props.get(key) == wanted]
            if matched:
                return matched
    return [t for t in templates if t.urn in node_group.dependencies]


@stack_rule(
    "gpu-node-group-efa-interface",
    MANDATORY,
    description="The GPU node group's launch template has an EFA network interface.",
    resources="the GPU node group and its launch template",
    requires="the launch template has a network interface of type `efa`",
)
def gpu_node_group_efa(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
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
        answers = [_has_efa_interface(template) for template in templates]
        if True not in answers and None not in answers:
            violations.append(
                (
                    group.urn,
                    "the GPU node group's launch template has no network interface with interfaceType 'efa': "
                    "NCCL would fall back to TCP",
                )
            )
    return violations


def trusts_ec2(role: StackResource) -> bool | None:
    """Whether EC2 may assume the role (an instance role: a node's); None while its trust is unknown."""
    statements = policy_statements(role.props.get("assumeRolePolicy"))
    if statements is None:
        return None
    return any(
        dig(statement, "Effect") == "Allow"
        and "ec2.amazonaws.com" in as_list(dig(statement, "Principal", "Service"))
        for statement in statements
    )


@stack_rule(
    "node-role-least-privilege",
    MANDATORY,
    description="A node role holds neither the VPC CNI's policy nor ECR's read-only one.",
    resources="IAM roles EC2 assumes (node roles) and their policy attachments",
    requires="no `AmazonEKS_CNI_Policy` (the VPC CNI's own IRSA role holds it) and no `AmazonEC2ContainerRegistryReadOnly` (`AmazonEC2ContainerRegistryPullOnly` instead), attached or in `managedPolicyArns`",
)
def node_role_least_privilege(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """A node role holds what a node needs and no more: any host-network pod (the EFA counter reader's,
    aws-node) reads the node's credentials from instance metadata, which the hop limit keeps only
    from pods in their own network namespace."""
    attachments = [r for r in resources if r.type == ROLE_POLICY_ATTACHMENT]
    violations = []
    for role in (r for r in resources if r.type == ROLE and trusts_ec2(r)):
        held = [a.props.get("policyArn") for a in linked(role, "name", attachments, "role")]
        held += as_list(role.props.get("managedPolicyArns"))
        for arn in held:
            for policy, instead in NODE_ROLE_FORBIDDEN.items():
                if isinstance(arn, str) and arn.endswith(f":{policy}"):
                    violations.append((role.urn, f"the node role holds {policy.split('/')[1]}: {instead}"))
    return violations
