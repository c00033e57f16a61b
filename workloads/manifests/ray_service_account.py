"""The Ray pods' identity (ServiceAccount), mapped by IRSA to the checkpoint bucket's role."""

from __future__ import annotations


def service_account(name: str, namespace_name: str, role_arn: object) -> dict:
    """The Ray pods' identity; IRSA maps it to the checkpoint bucket's role."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace_name,
            "annotations": {"eks.amazonaws.com/role-arn": role_arn},
        },
    }
