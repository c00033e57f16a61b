"""The Ray namespace's NetworkPolicies: nothing in or out by default, and the Ray pods' own traffic.

Two objects, as the Kubernetes documentation lays out a namespace's isolation ("Network Policies",
https://kubernetes.io/docs/concepts/services-networking/network-policies/, "Default deny all
ingress and all egress traffic"; policies are additive, so a pod is allowed the union of the rules
of the policies that select it):

- `namespace_default_deny`: every pod of the namespace, present or future, isolated for ingress and
  egress with no rule, so a pod no other policy selects can neither be reached nor reach anything;
- `ray_pods_network_policy`: every pod of the RayCluster (head and workers, `ray.io/cluster`),
  reached only by the RayCluster's own pods and reaching only what a job needs (below).

Every Ray pod listens on more than the head's `RAY_PORTS`: KubeRay v1.7.0 starts each one with
`--dashboard-agent-listen-port=52365` (ray-operator/controllers/ray/common/pod.go), whose agent
serves `POST /api/job_agent/jobs/` (ray python/ray/dashboard/modules/job/job_agent.py), and the
raylet, object manager and worker ports. Nothing outside the RayCluster needs them:
- the KubeRay operator (namespace `kuberay`) queries Ray only for RayJobs and RayServices, never for
  a plain RayCluster (kuberay v1.7.0, ray-operator/controllers/ray);
- the kubelet's probes (KubeRay's `httpGet` on 52365 for Ray 2.53 and later, `exec` before) come
  from the pod's own node, which Kubernetes always admits ("the traffic source is the pod's local
  node", NetworkPolicySpec.ingress in the API reference) and the VPC CNI's policy agent too (it
  adds the node's address to the ingress and egress maps of every pod it applies policies to:
  aws/aws-network-policy-agent, pkg/fwruleprocessor/fw_rule_processor.go);
- the training run reaches the head by `kubectl exec`, and a person the dashboard by `kubectl
  port-forward`: both through the API server and the kubelet, which network policies do not see;
- the CloudWatch agent reads the kubelet, the DCGM exporter and the node's sysfs, never a Ray pod
  (`infra.resources.observability.addon_configuration`).

What the Ray pods reach (`ray_pods_network_policy`'s egress):
- each other, on every port: Ray's GCS, raylet, object manager and worker ports, the dashboard
  agents, and NCCL's socket bootstrap and TCP transport between the workers;
- CoreDNS, UDP and TCP 53: the Ray pods name the head by its Service and AWS by its endpoints. They
  ask the kube-dns Service's cluster IP, which the VPC CNI's agent sees before kube-proxy rewrites
  it; its controller adds the cluster IP of every Service whose selector the rule's pod selector
  matches (aws/amazon-network-policy-controller-k8s, pkg/resolvers/endpoints.go,
  `getMatchingServiceClusterIPs`), so the rule names CoreDNS's pods by the Service's own selector;
- TCP 443 anywhere: S3 (checkpoints), STS (IRSA's AssumeRoleWithWebIdentity), CloudWatch
  (PutMetricData), the Hugging Face Hub. A NetworkPolicy names destinations by address only (the
  documentation's "What you can't do with network policies": no targeting of services by name), and
  these endpoints answer from large, changing sets of public addresses (AWS's ip-ranges.json, the
  Hub's CDN), so no `ipBlock` can name them one by one. Images are pulled by the node's container
  runtime, not the pods; the pods use no instance metadata (IRSA; the nodes' hop limit of 1 keeps it
  from them anyway);
- the GPU node's EFA counter reader, TCP `READER_PORT` on the node's address in the GPU subnet
  (`workloads.efa_counter_reader`). The VPC CNI's agent lets a pod reach its own node's address
  whatever the rules say (above); the rule declares the need all the same, for any other enforcer,
  to which a host-network pod is its node's address.

EFA's own traffic (SRD, through libfabric's OS bypass) never passes the pod's network interface
(AWS EC2 user guide, "Elastic Fabric Adapter": the application talks to the device directly), where
the VPC CNI's agent enforces policies (eBPF on the pod's host-side veth; EKS user guide, "Limit Pod
traffic with Kubernetes network policies": only the pod's primary interface), so no NetworkPolicy
can limit it: the security groups of the EFA interfaces do (`infra.resources.node_groups`).
"""

from __future__ import annotations

from platform_contract import (
    PART_OF_LABELS,
)
from workloads.efa_counter_reader import READER_PORT
from workloads.manifests.charts import KUBE_SYSTEM
from workloads.manifests.pod_labels import ray_cluster_pod_labels

# The label the API server puts on every namespace, its name (Kubernetes documentation, "Network
# Policies", "Targeting a Namespace by its name").
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# CoreDNS, as EKS's CoreDNS add-on runs it: the Deployment's pods carry `k8s-app: kube-dns` (EKS user
# guide, "Manage CoreDNS", its default topologySpreadConstraints), in `kube-system` (`KUBE_SYSTEM`), answering on
# port 53 over UDP and TCP.
DNS_POD_LABELS = {"k8s-app": "kube-dns"}
DNS_PORT = 53
HTTPS_PORT = 443
# Every IPv4 address: the cluster's VPC and pods are IPv4 (`infra.resources.network`).
ANYWHERE = "0.0.0.0/0"


def namespace_default_deny(namespace_name: str) -> dict:
    """Every pod of the namespace isolated for ingress and egress, with no rule: only what another
    policy allows a pod gets in or out."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny", "namespace": namespace_name, "labels": dict(PART_OF_LABELS)},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def ray_pods_network_policy(cluster_name: str, namespace_name: str, gpu_subnet_cidr: str) -> dict:
    """Every pod of the RayCluster: reached by the RayCluster's own pods only; reaching those pods,
    CoreDNS, HTTPS anywhere and its node's EFA counter reader (the module's docstring says why)."""
    own_pods = [{"podSelector": {"matchLabels": ray_cluster_pod_labels(cluster_name)}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{cluster_name}-pods",
            "namespace": namespace_name,
            "labels": dict(PART_OF_LABELS),
        },
        "spec": {
            "podSelector": {"matchLabels": ray_cluster_pod_labels(cluster_name)},
            "policyTypes": ["Ingress", "Egress"],
            # A pod selector without a namespace selector: pods of this namespace only.
            "ingress": [{"from": own_pods}],
            "egress": [
                {"to": own_pods},
                {
                    # One peer with both selectors: CoreDNS's pods in kube-system, not either alone.
                    "to": [
                        {
                            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: KUBE_SYSTEM}},
                            "podSelector": {"matchLabels": dict(DNS_POD_LABELS)},
                        }
                    ],
                    "ports": [
                        {"protocol": "UDP", "port": DNS_PORT},
                        {"protocol": "TCP", "port": DNS_PORT},
                    ],
                },
                {"to": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": [{"protocol": "TCP", "port": HTTPS_PORT}]},
                {
                    "to": [{"ipBlock": {"cidr": gpu_subnet_cidr}}],
                    "ports": [{"protocol": "TCP", "port": READER_PORT}],
                },
            ],
        },
    }
