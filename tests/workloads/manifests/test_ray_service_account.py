"""`workloads/manifests/ray_service_account.py`: the Ray pods' identity, mapped by IRSA to a role
(its schema: test_kubernetes_schemas.py)."""

from __future__ import annotations

from workloads.manifests.ray_service_account import (
    ROLE_ARN_ANNOTATION,
    TOKEN_EXPIRATION_ANNOTATION,
    service_account,
)

ROLE = "arn:aws:iam::123456789012:role/ray"


def test_irsa_maps_the_account_to_the_role_with_hour_long_tokens():
    account = service_account("ray-train", "ray-train", ROLE)
    assert account["metadata"]["annotations"] == {
        ROLE_ARN_ANNOTATION: ROLE,
        TOKEN_EXPIRATION_ANNOTATION: "3600",
    }
    # The pod identity webhook raises anything under 600 s to 600 (pkg/constants.go).
    assert int(account["metadata"]["annotations"][TOKEN_EXPIRATION_ANNOTATION]) >= 600


def test_no_kubernetes_api_token_is_mounted_into_the_ray_pods():
    account = service_account("ray-train", "ray-train", ROLE)
    assert account["automountServiceAccountToken"] is False
    assert (account["metadata"]["name"], account["metadata"]["namespace"]) == ("ray-train", "ray-train")
