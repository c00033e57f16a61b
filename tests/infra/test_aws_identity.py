"""`infra/aws_identity.py`, the shim that resolves the name TrainingRun states stored before the packages'
regrouping give the AWS credential settings (`infra.aws_identity:AwsCredentialSettings`; the golden
states of tests/fixtures/training_run/stored_providers/ load through it in test_engine_host.py)."""

from __future__ import annotations

import pickle

from infra.config.aws_identity import AwsCredentialSettings


def test_the_old_name_resolves_to_the_settings_class_of_today():
    # A pickle's global reference, as a stored provider holds it: GLOBAL "module\nname\n", then STOP.
    stored = b"cinfra.aws_identity\nAwsCredentialSettings\n."
    assert pickle.loads(stored) is AwsCredentialSettings
