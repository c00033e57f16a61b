"""A resume's compatibility (training/components/resume.py): what a checkpoint records for a resume
(its checkpoint settings) and the one-line refusal of a resume that would not train as the
uninterrupted run would."""

from __future__ import annotations

import pytest

from training.config.run_config import parse_args
from training.errors import UsageError


def test_a_resume_keeps_the_global_batch_however_workers_and_micro_batches_split_it():
    """A checkpoint of 2 workers x --batch-size 8 x 1 micro-batch (16 sequences a step) resumes on
    1 worker x 2 micro-batches, which trains on the same rows (`epoch_batches`); not on 1 x 1 (8)
    or 4 x 1 (32), nor with another --batch-size making 16."""
    from training.components.resume import check_resume, checkpoint_settings

    saved = {"step": 4, **checkpoint_settings(parse_args([]), 2, "abc")}
    assert saved["global_batch"] == 16
    check_resume(saved, checkpoint_settings(parse_args(["--grad-accum-steps", "2"]), 1, "abc"), 30, "ckpt")
    with pytest.raises(UsageError) as halved:
        check_resume(saved, checkpoint_settings(parse_args([]), 1, "abc"), 30, "ckpt")
    assert str(halved.value) == (
        "ckpt was written with a global batch of 16 sequences (world size 2 x --batch-size 8 x "
        "--grad-accum-steps 1); this run's is 8 (1 x 8 x 1): pass --grad-accum-steps 2 to keep it, "
        "or take its weights alone with --init-from"
    )
    with pytest.raises(
        UsageError, match=r"this run's is 32 \(4 x 8 x 1\): run workers x --grad-accum-steps = 2 "
    ):
        check_resume(saved, checkpoint_settings(parse_args([]), 4, "abc"), 30, "ckpt")
    with pytest.raises(UsageError, match=r"^ckpt was written with --batch-size 8: resume with the same"):
        check_resume(
            saved,
            checkpoint_settings(parse_args(["--batch-size", "4", "--grad-accum-steps", "2"]), 2, "abc"),
            30,
            "ckpt",
        )
    # Checkpoints from before these keys: checked on what they hold (no accumulation then).
    check_resume({"step": 4}, checkpoint_settings(parse_args(["--batch-size", "3"]), 2, "abc"), 30, "ckpt")
    old = {"step": 4, "world_size": 2, "batch_size": 8}
    check_resume(old, checkpoint_settings(parse_args(["--grad-accum-steps", "2"]), 1, "abc"), 30, "ckpt")
    with pytest.raises(UsageError, match=r"global batch of 16 sequences .*this run's is 32"):
        check_resume(old, checkpoint_settings(parse_args(["--grad-accum-steps", "2"]), 2, "abc"), 30, "ckpt")


COSINE = ["--steps", "8", "--lr-schedule", "cosine", "--warmup-steps", "2"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--steps", "12"], "--steps 8 (its --lr-schedule cosine decays towards the last step)"),
        (["--lr", "0.01"], "--lr 0.003"),
        (["--warmup-steps", "3"], "--warmup-steps 2"),
        (["--min-lr-ratio", "0.1"], "--min-lr-ratio 0.0"),
        (["--lr-schedule", "linear"], "--lr-schedule cosine"),
        (["--lr-schedule", "constant"], "--lr-schedule cosine"),
    ],
)
def test_a_resume_that_changes_the_learning_rate_schedule_is_refused(flags, named):
    """Resumed at step 4 of a cosine run of 8 steps with --steps 12, step 5 trained at 2.65e-3
    instead of 1.96e-3, without a word."""
    from training.components.resume import check_resume, checkpoint_settings

    saved = {"step": 4, **checkpoint_settings(parse_args(COSINE), 2, "abc")}
    changed = parse_args([*COSINE, *flags])
    with pytest.raises(UsageError) as refused:
        check_resume(saved, checkpoint_settings(changed, 2, "abc"), changed.steps, "ckpt")
    assert str(refused.value) == (
        f"ckpt was written with {named}: resume with the same, so the learning rate of every step is "
        "the uninterrupted run's, or take its weights alone with --init-from"
    )


def test_a_resume_may_change_what_its_schedule_does_not_read():
    """A constant rate does not depend on --steps (a run goes on past its end), nor cosine on
    --decay-ratio (wsd's)."""
    from training.components.resume import check_resume, checkpoint_settings

    constant = {"step": 8, **checkpoint_settings(parse_args(["--steps", "8"]), 2, "abc")}
    check_resume(constant, checkpoint_settings(parse_args(["--steps", "20"]), 2, "abc"), 20, "ckpt")
    cosine = {"step": 4, **checkpoint_settings(parse_args(COSINE), 2, "abc")}
    check_resume(
        cosine, checkpoint_settings(parse_args([*COSINE, "--decay-ratio", "0.5"]), 2, "abc"), 8, "ckpt"
    )
    wsd = ["--steps", "8", "--lr-schedule", "wsd"]
    saved = {"step": 4, **checkpoint_settings(parse_args(wsd), 2, "abc")}

    with pytest.raises(UsageError, match=r"^ckpt was written with --decay-ratio 0.2: "):
        check_resume(
            saved, checkpoint_settings(parse_args([*wsd, "--decay-ratio", "0.5"]), 2, "abc"), 8, "ckpt"
        )


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--seq-len", "64", "--seq-len 128"),
        ("--seed", "1", "--seed 0"),
        ("--batch-size", "4", "--batch-size 8"),
    ],
)
def test_a_resume_names_the_flag_whose_value_differs_from_the_checkpoint(flag, value, named):
    from training.components.resume import check_resume, checkpoint_settings

    saved = {"step": 4, **checkpoint_settings(parse_args([]), 2, "abc")}
    changed = parse_args([flag, value])
    with pytest.raises(UsageError, match=rf"^ckpt was written with {named}: resume with the same"):
        check_resume(saved, checkpoint_settings(changed, 2, "abc"), 30, "ckpt")
    # Another split of the global batch resumes (the replay goes by global sample index); another
    # corpus does not.
    check_resume(saved, checkpoint_settings(parse_args(["--grad-accum-steps", "2"]), 1, "abc"), 30, "ckpt")
    with pytest.raises(UsageError, match=r"^ckpt was trained on other rows \(--data or --tokenizer"):
        check_resume(saved, checkpoint_settings(parse_args([]), 2, "other"), 30, "ckpt")


@pytest.mark.parametrize("steps", [4, 3])
def test_a_resume_at_or_past_steps_says_so(steps):
    from training.components.resume import check_resume, checkpoint_settings

    settings = checkpoint_settings(parse_args([]), 2, "abc")
    with pytest.raises(
        UsageError, match=rf"^ckpt is at step 4: --steps {steps} leaves nothing to train; pass --steps > 4$"
    ):
        check_resume({"step": 4, **settings}, settings, steps, "ckpt")


class _Architecture:
    """The part of a transformers config a train state records."""

    def to_json_string(self, use_diff: bool) -> str:
        assert not use_diff
        return '{"model_type": "qwen2", "hidden_size": 64}'


def test_a_checkpoints_train_state_holds_what_a_resume_reads():
    """`CheckpointContents.train_state`: the step, the history so far (a copy), the checkpoint
    settings, the score, the data position after the steps since the start, the architecture and
    the tokenizer; no data position for synthetic tokens."""
    from training.components.checkpoint import CHECKPOINT_SCORE
    from training.components.resume import CheckpointContents, checkpoint_settings

    settings = checkpoint_settings(parse_args([]), 2, "abc")  # a global batch of 16 rows
    history = [{"step": 4, "loss": 3.0}]
    contents = CheckpointContents(
        model=None,  # type: ignore[arg-type]  # a train state reads neither
        optimizer=None,  # type: ignore[arg-type]
        architecture=_Architecture(),
        settings=settings,
        history=history,
        start_step=3,
        position=(1, 8),
        rows=100,
        tokenizer="bytes",
        export_dtype=None,
        rank=0,
    )
    state = contents.train_state(5, 2.5)
    history.append({"step": 6, "loss": 2.9})
    assert state == {
        "step": 5,
        "history": [{"step": 4, "loss": 3.0}],
        **settings,
        CHECKPOINT_SCORE: 2.5,
        "data_position": (1, 40),  # 2 steps of 16 rows after row 8 of epoch 1
        "architecture": {"model_type": "qwen2", "hidden_size": 64},
        "tokenizer": "bytes",
    }
    contents.rows = None
    assert "data_position" not in contents.train_state(5, None)
