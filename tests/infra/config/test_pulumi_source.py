"""The stack's values as the Pulumi engine holds them (`infra.config.pulumi_source`): one namespace
at a time, without its prefix, and a Hugging Face token that must stay a secret."""

from __future__ import annotations

import pulumi
import pytest

from infra.config.parsing import ConfigError
from infra.config.pulumi_source import load_settings, stack_config_values

VALUES = {
    "aws:region": "us-east-2",
    "eks-ray-train:endpointPublicAccessCidrs": '["203.0.113.7/32"]',
    "eks-ray-train:gpuNodeCount": "3",
    "other-project:gpuNodeCount": "9",
}


class NoResources(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        raise AssertionError(f"loading the settings registered {args.typ}")

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        raise AssertionError(f"loading the settings called {args.token}")


@pytest.fixture
def engine(monkeypatch):
    """A dev stack's engine, whose config the test sets; emptied afterwards."""
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    pulumi.runtime.set_mocks(NoResources(), project="eks-ray-train", stack="dev", preview=True)
    yield pulumi.runtime.set_all_config
    pulumi.runtime.set_all_config({}, [])


def test_each_namespace_arrives_without_its_prefix(engine):
    engine(VALUES, [])
    assert stack_config_values() == {"endpointPublicAccessCidrs": '["203.0.113.7/32"]', "gpuNodeCount": "3"}
    assert stack_config_values("aws") == {"region": "us-east-2"}


def test_the_loaded_settings_are_the_parsed_values(engine):
    engine(VALUES, [])
    settings = load_settings()
    assert (settings.region, settings.gpu_node_count, settings.has_hf_token) == ("us-east-2", 3, False)


def test_a_hugging_face_token_in_plain_text_is_refused_and_a_secret_one_taken(engine):
    engine({**VALUES, "eks-ray-train:hfToken": "hf_example"}, [])
    with pytest.raises(ConfigError, match=r"'hfToken' is stored in plain text .* --secret hfToken"):
        load_settings()
    engine({**VALUES, "eks-ray-train:hfToken": "hf_example"}, ["eks-ray-train:hfToken"])
    assert load_settings().has_hf_token
