"""Resolves `infra.aws_identity.AwsCredentialSettings`, named by TrainingRun states stored before the packages' regrouping (2026-12-04)."""

from infra.config.aws_identity import AwsCredentialSettings

__all__ = ["AwsCredentialSettings"]
