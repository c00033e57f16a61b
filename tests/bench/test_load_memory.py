"""The load-memory benchmark's inputs: the config each rank builds, the paths each init measures,
and a shallower copy of an architecture of the same widths."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.load_memory import PATHS, _config, with_layers
from training.config.run_config import load_model_config


def test_a_shallower_copy_keeps_every_width_and_the_vocabulary(tmp_path):
    path = with_layers("tiny", 1, str(tmp_path))
    written, original = json.loads(Path(path).read_text()), load_model_config("tiny")
    assert (written["num_hidden_layers"], written["max_window_layers"]) == (1, 1)
    assert {
        key: value for key, value in written.items() if key not in ("num_hidden_layers", "max_window_layers")
    } == {
        key: value for key, value in original.items() if key not in ("num_hidden_layers", "max_window_layers")
    }
    assert load_model_config(path) == written  # the job reads it as --model-config


def test_each_init_measures_the_baseline_first_and_the_loops_own_path_last():
    assert PATHS["random"] == ("every-rank-full", "meta-broadcast")
    assert PATHS["pretrained"][-1] == "per-shard" and PATHS["pretrained"][0] == "every-rank-full"
    args = argparse.Namespace(model_config="tiny", init="pretrained", model_id="/tmp/weights")
    config = _config(args)
    assert (config.model_config, config.init, config.model_id) == ("tiny", "pretrained", "/tmp/weights")
    assert config.compile is False
    random = _config(argparse.Namespace(model_config="tiny", init="random", model_id=None))
    assert (random.init, random.data, config.data) == ("random", "synthetic", "synthetic")
