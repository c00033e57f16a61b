"""The shipped architectures (training/config/model_configs.py, training/architectures/)."""

from __future__ import annotations

import json

from training.config.model_configs import CONFIG_DIR


def test_shipped_configs_load_into_qwen2config():
    from transformers import Qwen2Config

    for path in CONFIG_DIR.glob("*.json"):
        config = Qwen2Config(**json.loads(path.read_text()))
        assert config.tie_word_embeddings
