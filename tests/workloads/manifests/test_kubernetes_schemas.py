"""Every core object (Namespace, ServiceAccount, ConfigMap, Secret, NetworkPolicy, PodDisruptionBudget) against the Kubernetes schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.harness.manifest_checks import CODE, KUBERNETES_VERSION
from workloads import efa_counter_reader, manifests


@pytest.mark.parametrize(
    "manifest",
    [
        manifests.namespace("ray-train"),
        manifests.kuberay_namespace(),
        manifests.service_account("ray-train", "ray-train", "arn:aws:iam::123456789012:role/ray"),
        manifests.training_code_configmap("training-code", "ray-train", CODE),
        manifests.hf_token_secret("ray-train", "hf_example"),
        manifests.namespace_default_deny("ray-train"),
        manifests.ray_pods_network_policy("ray-train", "ray-train", "10.0.0.0/18"),
        manifests.head_disruption_budget("ray-train", "ray-train"),
        efa_counter_reader.reader_namespace(),
        efa_counter_reader.reader_daemonset("763104351884.dkr.ecr.us-east-2.amazonaws.com/ray:2.58.0-gpu"),
    ],
    ids=lambda m: f"{m['kind']}-{m['metadata']['name']}",
)
def test_core_objects_match_kubernetes_schemas(manifest):
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
