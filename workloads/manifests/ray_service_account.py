"""The Ray pods' identity (ServiceAccount), mapped by IRSA to the checkpoint bucket's role."""

from __future__ import annotations

# IRSA's annotations of a service account (amazon-eks-pod-identity-webhook README): the role the
# pods assume, and the lifetime of the service account token they exchange for its credentials.
ROLE_ARN_ANNOTATION = "eks.amazonaws.com/role-arn"
TOKEN_EXPIRATION_ANNOTATION = "eks.amazonaws.com/token-expiration"
# An hour, where the webhook's default is a day (86400 s; it raises anything under 600 s to 600,
# pkg/constants.go): a token taken out of a pod opens the role that much shorter. The kubelet
# renews the projected token before it expires, and the AWS SDKs read the renewed file.
TOKEN_EXPIRATION_S = 3600


def service_account(name: str, namespace_name: str, role_arn: object) -> dict:
    """The Ray pods' identity; IRSA maps it to the checkpoint bucket's role, with hour-long tokens.

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
            "annotations": {
                ROLE_ARN_ANNOTATION: role_arn,
                TOKEN_EXPIRATION_ANNOTATION: str(TOKEN_EXPIRATION_S),
            },
        },
        "automountServiceAccountToken": False,
    }
