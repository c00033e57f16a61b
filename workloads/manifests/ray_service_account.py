"""The Ray pods' identity (ServiceAccount), mapped by IRSA to the checkpoint bucket's role."""

from __future__ import annotations


def service_account(name: str, namespace_name: str, role_arn: object) -> dict:
    """The Ray pods' identity; IRSA maps it to the checkpoint bucket's role.

    No Kubernetes API token is mounted into its pods by default: Ray here calls no Kubernetes API
    (`enableInTreeAutoscaling: false`). IRSA does not need that token: EKS's pod identity webhook
    adds its own projected token volume, `aws-iam-token` (audience `sts.amazonaws.com`), to each pod
    of a service account with the role-arn annotation, whatever `automountServiceAccountToken` says
    (aws/amazon-eks-pod-identity-webhook pkg/handler/handler.go, which never reads that field).
    """
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace_name,
            "annotations": {"eks.amazonaws.com/role-arn": role_arn},
        },
        "automountServiceAccountToken": False,
    }
