"""The Hugging Face token (Secret) and the optional file the Ray pods read it from."""

from __future__ import annotations

HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
# Gated models need a Hugging Face token. The pods read it from a file of a Secret volume rather
# than an environment variable, which every process of the pod inherits and prints with its
# environment. huggingface_hub reads the file named by `HF_TOKEN_PATH` when `HF_TOKEN` is unset
# (huggingface_hub 1.33.0 constants.py `HF_TOKEN_PATH`, utils/_auth.py `get_token`), and a file
# that does not exist means no token. The volume is optional, so pods start the same without one.
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
HF_TOKEN_VOLUME = {
    "name": HF_TOKEN_SECRET,
    "secret": {
        "secretName": HF_TOKEN_SECRET,
        "optional": True,
        "items": [{"key": HF_TOKEN_KEY, "path": HF_TOKEN_KEY}],
        "defaultMode": 0o400,
    },
}
HF_TOKEN_MOUNT = {"name": HF_TOKEN_SECRET, "mountPath": HF_TOKEN_DIR, "readOnly": True}
HF_TOKEN_PATH_ENV = {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"}


def hf_token_secret(namespace_name: str, token: object) -> dict:
    """The token as a Kubernetes Secret, read by the Ray pods as the file `HF_TOKEN_PATH` names."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": HF_TOKEN_SECRET, "namespace": namespace_name},
        "type": "Opaque",
        "stringData": {HF_TOKEN_KEY: token},
    }
