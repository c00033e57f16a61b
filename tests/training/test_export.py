"""`python -m training.export` on folders it cannot export: one line on stderr and exit 2. Exports
of real checkpoints are tests/training/components/test_checkpoint.py's, on the checkpoints its
one-rank runs write."""

from __future__ import annotations

import json

from training.config.run_config import TRAIN_STATE_FILE


def test_exporting_a_folder_that_is_no_checkpoint_is_one_line(tmp_path, capsys):
    from training.export import main

    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err
        == f"python -m training.export: error: {tmp_path}: not a checkpoint folder (no train_state.json)\n"
    )


def test_a_checkpoint_without_its_architecture_is_one_line_naming_the_other_way(tmp_path, capsys):
    """A checkpoint written before checkpoints recorded their architecture cannot be rebuilt."""
    from training.export import main

    (tmp_path / TRAIN_STATE_FILE).write_text(json.dumps({"step": 3}))
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"python -m training.export: error: {tmp_path}: written before checkpoints recorded their "
        "architecture; export at the end of a run with --export-hf instead\n"
    )
    assert not (tmp_path / "out").exists()
