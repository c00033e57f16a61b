"""The preflight alone in a mocked `pulumi preview`: the placement it returns, or its refusal; or
one of its reads alone (`read_in_preview`).

Shared by the tests of `infra/preflight/`, one file per module there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import pulumi
import pytest

from infra.config.stack import parse_settings
from infra.preflight import Placement, PreflightError, place_nodes
from tests.harness.fake_aws import FakeAws, FakeAwsMocks

RESERVATION = "cr-0123456789abcdef0"
QUOTA_TOKEN = "aws:servicequotas/getServiceQuota:getServiceQuota"
T = TypeVar("T")
# The time of every preview here: reservation dates are set against it.
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


class RecordingMocks(FakeAwsMocks):
    """Also records every resource the code under test registers or reads: the preflight must do neither."""

    def __init__(self, aws: FakeAws):
        super().__init__(aws)
        self.registered: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        self.registered.append(f"{args.typ} {args.name}")
        return super().new_resource(args)


def place(fake: FakeAws, now: datetime = NOW, **config) -> tuple[Placement, str, list[str]]:
    """Run `place_nodes` in a mocked `pulumi preview`; return the placement and its zones.

    Fails the test when the preflight registered or read any resource, whether it passed or refused.
    """
    mocks = RecordingMocks(fake)
    pulumi.runtime.set_mocks(mocks, project="eks-ray-train", stack="dev", preview=True)
    settings = parse_settings(
        {"endpointPublicAccessCidrs": ["203.0.113.7/32"], **config}, fake.region, stack="dev"
    )
    placed: list[Placement] = []

    @pulumi.runtime.test
    def run():
        placed.append(place_nodes(settings, lambda: now))

    try:
        run()
    finally:
        assert mocks.registered == [], f"the preflight registered {mocks.registered}"
    placement = placed[0]
    return placement, placement.gpu_az, placement.cluster_azs


def refusal(fake: FakeAws, error: type[Exception] = PreflightError, **config) -> str:
    with pytest.raises(error) as caught:
        place(fake, **config)
    return str(caught.value)


def read_in_preview(fake: FakeAws, read: Callable[[], T]) -> T:
    """`read()` in a mocked `pulumi preview` whose AWS provider is `fake`: its answer, or its exception.

    Fails the test when the read registered a resource."""
    mocks = RecordingMocks(fake)
    pulumi.runtime.set_mocks(mocks, project="eks-ray-train", stack="dev", preview=True)
    answers: list[T] = []

    @pulumi.runtime.test
    def run():
        answers.append(read())

    try:
        run()
    finally:
        assert mocks.registered == [], f"the read registered {mocks.registered}"
    return answers[0]
