"""The Hugging Face token (Secret) and the optional reference the Ray pods read it through."""

from __future__ import annotations

HF_TOKEN_SECRET = "hf-token"
# Gated models need a Hugging Face token; optional, so pods start the same without one.
HF_TOKEN_ENV = {
    "name": "HF_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token", "optional": True}},
}


def hf_token_secret(namespace_name: str, token: object) -> dict:
    """The token as a Kubernetes Secret, consumed by the Ray pods as `HF_TOKEN`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": HF_TOKEN_SECRET, "namespace": namespace_name},
        "type": "Opaque",
        "stringData": {"token": token},
    }
