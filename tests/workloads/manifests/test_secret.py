"""`workloads/manifests/secret.py`: the Hugging Face token's Secret, and the file the Ray pods read it
from (its schema: test_kubernetes_schemas.py)."""

from __future__ import annotations

from typing import Any, cast

from workloads.manifests.secret import (
    HF_TOKEN_KEY,
    HF_TOKEN_MOUNT,
    HF_TOKEN_PATH_ENV,
    HF_TOKEN_SECRET,
    HF_TOKEN_VOLUME,
    hf_token_secret,
)

# The volume's secret source (typed as what it is: a JSON object).
SOURCE = cast(dict[str, Any], HF_TOKEN_VOLUME["secret"])


def test_hf_token_path_names_the_file_the_volume_mounts_from_the_secret():
    secret = hf_token_secret("ray-train", "hf_example")
    assert secret["metadata"] == {"name": HF_TOKEN_SECRET, "namespace": "ray-train"}
    assert secret["stringData"] == {HF_TOKEN_KEY: "hf_example"}
    assert SOURCE["secretName"] == secret["metadata"]["name"]
    item = SOURCE["items"][0]
    assert item["key"] in secret["stringData"]
    assert HF_TOKEN_MOUNT["name"] == HF_TOKEN_VOLUME["name"]
    assert {
        "name": "HF_TOKEN_PATH",
        "value": f"{HF_TOKEN_MOUNT['mountPath']}/{item['path']}",
    } == HF_TOKEN_PATH_ENV


def test_pods_start_without_the_secret_and_read_it_only_as_owner():
    assert SOURCE["optional"] is True
    assert SOURCE["defaultMode"] == 0o400
    assert HF_TOKEN_MOUNT["readOnly"] is True
