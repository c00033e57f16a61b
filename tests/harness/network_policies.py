"""Whether Kubernetes NetworkPolicies let a connection through: a model of networking.k8s.io/v1.

Read from the Kubernetes documentation, "Network Policies"
(https://kubernetes.io/docs/concepts/services-networking/network-policies/), and the field
descriptions of NetworkPolicySpec, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort
and IPBlock in the API reference (the schemas `kubernetes_validate` vendors for Kubernetes 1.36):

- A pod is isolated for ingress (egress) when a NetworkPolicy of its namespace selects it
  (`podSelector`; empty or missing: every pod of the namespace) and has that direction in its
  `policyTypes`; without `policyTypes`, every policy is an ingress one and a policy with egress
  rules an egress one too.
- A connection is allowed when the source's egress and the destination's ingress both allow it: a
  side that is not isolated allows everything, an isolated side what at least one rule of one of
  the policies selecting it allows (policies are additive). An isolated pod's own node may always
  connect to it.
- A rule allows a connection when one of its peers (`from`/`to`; empty or missing: every source or
  destination) and one of its ports (empty or missing: every port) match.
- A peer: `ipBlock` (the address in `cidr` and in no `except`), `podSelector` alone (pods of the
  policy's namespace), `namespaceSelector` alone (every pod of the namespaces it selects; `{}`:
  every namespace), both in one peer (pods matching the pod selector in namespaces matching the
  namespace selector: AND, where two peers are OR).
- A port: `protocol` (TCP when missing), `port` (a number, or a name the destination pod gives one
  of its container ports; missing: every port of the protocol), `endPort` (a range, inclusive).
- Selectors: `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist), all of them.
  Every namespace carries `kubernetes.io/metadata.name: <its name>`.

Host-network pods and nodes are selected by no policy; a policy sees them by address only. Whether
an `ipBlock` also matches pod addresses is left to the network plugin (the documentation: ipBlocks
"should be cluster-external IPs"); the VPC CNI matches any address, pods' included, and so does this
model, the stricter reading for a test that something cannot be reached.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (it has a namespace), a node or host-network pod, or an address
    outside the cluster (neither). `ports` names the pod's container ports, for named policy ports."""

    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    address: str | None = None
    node: str | None = None
    ports: Mapping[str, int] = field(default_factory=dict)

    def in_namespace_labels(self) -> dict[str, str]:
        return {**self.namespace_labels, NAMESPACE_NAME_LABEL: self.namespace or ""}


def pod(namespace: str, labels: Mapping[str, str] | None = None, **where) -> Endpoint:
    return Endpoint(namespace=namespace, labels=dict(labels or {}), **where)


def host(address: str, node: str | None = None) -> Endpoint:
    """A node, or a pod in its node's network namespace (the EFA counter reader)."""
    return Endpoint(address=address, node=node)


def outside(address: str) -> Endpoint:
    return Endpoint(address=address)


def selector_matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels: every `matchLabels` pair and every expression; `{}` matches all."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        holds = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not holds:
            return False
    return True


def _selects(policy: Mapping, endpoint: Endpoint) -> bool:
    return endpoint.namespace is not None and (
        policy["metadata"].get("namespace") == endpoint.namespace
        and selector_matches(policy["spec"].get("podSelector"), endpoint.labels)
    )


def policy_types(policy: Mapping) -> set[str]:
    """`policyTypes`, or its default: Ingress, and Egress when the policy has egress rules."""
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return set(spec["policyTypes"])
    return {"Ingress"} | ({"Egress"} if spec.get("egress") else set())


def _peer_matches(peer: Mapping, endpoint: Endpoint, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        if endpoint.address is None:
            return False
        address = ipaddress.ip_address(endpoint.address)
        block = peer["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(excepted) for excepted in block.get("except") or []
        )
    if endpoint.namespace is None:  # nodes and addresses outside: only ipBlocks name them
        return False
    if "namespaceSelector" in peer:
        in_namespace = selector_matches(peer["namespaceSelector"], endpoint.in_namespace_labels())
    else:
        in_namespace = endpoint.namespace == policy_namespace
    return in_namespace and selector_matches(peer.get("podSelector"), endpoint.labels)


def _port_matches(rule_port: Mapping, destination: Endpoint, port: int, protocol: str) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return destination.ports.get(wanted) == port
    return wanted <= port <= rule_port.get("endPort", wanted)


def _rule_allows(
    rule: Mapping,
    peers_key: str,
    peer: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str,
    policy_namespace: str,
) -> bool:
    peers, ports = rule.get(peers_key) or [], rule.get("ports") or []
    peer_ok = not peers or any(_peer_matches(p, peer, policy_namespace) for p in peers)
    port_ok = not ports or any(_port_matches(p, destination, port, protocol) for p in ports)
    return peer_ok and port_ok


def _side_allows(
    policies: Sequence[Mapping],
    isolated: Endpoint,
    direction: str,
    peer: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str,
) -> bool:
    """Whether `isolated`'s policies for `direction` ("Ingress" or "Egress") let `peer` through."""
    applying = [p for p in policies if _selects(p, isolated) and direction in policy_types(p)]
    if not applying:
        return True
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    return any(
        _rule_allows(rule, peers_key, peer, destination, port, protocol, p["metadata"]["namespace"])
        for p in applying
        for rule in p["spec"].get(rules_key) or []
    )


def allowed(
    policies: Sequence[Mapping], source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether a connection from `source` to `destination`'s `port` gets through both sides' policies."""
    egress = _side_allows(policies, source, "Egress", destination, destination, port, protocol)
    from_own_node = source.namespace is None and source.node is not None and source.node == destination.node
    ingress = from_own_node or _side_allows(
        policies, destination, "Ingress", source, destination, port, protocol
    )
    return egress and ingress
