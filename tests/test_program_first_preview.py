"""The first `pulumi preview` of a new stack: nothing exists yet, so every output the program reads back
from a resource is unknown, as the engine gives it (`run_program(first_preview=True)`)."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
from pulumi.output import Unknown
from pulumi.runtime import rpc
from pulumi.runtime.sync_await import _sync_await

from tests.harness.fake_aws import FakeAws
from tests.harness.fake_oci_registry import serving_the_program, the_programs_images
from tests.harness.preview_queries import NOW
from tests.harness.program import ROOT, TRAINING_RUN, Preview, config_of, dev_config, run_program
from tests.harness.provider_host import ProviderHost, plain

DEADLINE = "2026-12-05T18:00:00Z"  # 9 h after NOW: the window line says the run fits


@pytest.fixture(scope="module")
def first_preview() -> tuple[Preview, list[tuple[str, str]]]:
    """The dev stack's first preview, with a `training.deadline` so the window is judged; its log lines."""
    training = {**json.loads(dev_config()["eks-ray-train:training"]), "deadline": DEADLINE}
    logged: list[tuple[str, str]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: logged.append(("info", message)))
        patch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: logged.append(("warn", message)))
        plan = run_program(
            dev_config(training=json.dumps(training)),
            FakeAws(region="us-east-2"),
            now=NOW,
            first_preview=True,
        )
    return plan, logged


def known(value: Any) -> bool:
    return _sync_await(value.is_known()) if isinstance(value, pulumi.Output) else True


def unknown_inputs(value: Any, path: str = "") -> set[str]:
    """The paths of the inputs a registration sent unknown (`rpc.UNKNOWN`, deserialized as `Unknown`)."""
    if isinstance(value, Unknown):
        return {path}
    if isinstance(value, dict):
        return {
            found for key, item in value.items() for found in unknown_inputs(item, f"{path}.{key}".strip("."))
        }
    if isinstance(value, list):
        return {
            found for index, item in enumerate(value) for found in unknown_inputs(item, f"{path}[{index}]")
        }
    return set()


def as_sent(value: Any) -> Any:
    """An input as the engine sends it to the provider: an unknown one as the sentinel `rpc.UNKNOWN`,
    a secret unwrapped (the host answers Configure with `acceptSecrets: false`)."""
    value = rpc.unwrap_rpc_secret(value)
    if isinstance(value, Unknown):
        return rpc.UNKNOWN
    if isinstance(value, dict):
        return {key: as_sent(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_sent(item) for item in value]
    return value


def test_only_the_gpu_node_groups_name_is_unknown_to_the_training_run(first_preview):
    """Every other input of the TrainingRun is computed by the program at preview: the hashes, the job's
    arguments, the plan and its price; the node group's name is AWS's, known once it exists."""
    plan, _ = first_preview
    assert unknown_inputs(plan.one(TRAINING_RUN).inputs) == {"node_group_name"}


def test_the_plan_is_known_and_what_the_run_and_cluster_return_is_not(first_preview):
    plan, _ = first_preview
    training = plan.outputs["training"]
    assert known(training["lineRateGbps"]) and _sync_await(training["lineRateGbps"].future()) == 40
    assert isinstance(training["predictedTokensPerS"], float)
    planned = {key: value for key, value in training["cost"].items() if key != "measured"}
    assert planned["predictedUsd"] > 0 and all(known(value) for value in planned.values())
    assert not known(training["jobId"])
    assert not known(training["cost"]["measured"])
    assert not known(plan.outputs["kubeconfig"])


def test_the_preview_says_what_the_planner_and_the_window_found(first_preview):
    _, logged = first_preview
    assert any(line.startswith("forecast for 2 x 4 NVIDIA L4 at 40 Gbps") for _, line in logged)
    assert any("the training job is predicted network-bound on 2 x 4 NVIDIA L4" in line for _, line in logged)
    (window,) = [line for _, line in logged if line.startswith("run window: ")]
    assert window.startswith(f"run window: training.deadline {DEADLINE}.")
    assert f"the run fits before --deadline {DEADLINE}" in window


def test_the_real_provider_host_checks_the_first_previews_training_run(first_preview, host: ProviderHost):
    """The engine sends Check the inputs as registered, the node group's name as `rpc.UNKNOWN`
    (pulumi/dynamic/__main__.py, `check`: `rpc.deserialize_properties(request.news, True)`)."""
    plan, _ = first_preview
    inputs = {key: as_sent(value) for key, value in plan.one(TRAINING_RUN).inputs.items()}
    host.configure({"aws:region": "us-east-2"})
    response = host.check({}, inputs)
    assert list(response.failures) == []
    assert plain(response.inputs)["node_group_name"] == rpc.UNKNOWN


def test_a_stack_that_is_not_dev_shows_every_image_by_digest_in_its_first_preview():
    """Issue 60: the first preview of a new stack that is not dev, nothing given by digest, already
    shows each image as it will run: the Ray pods', the counter reader's and every chart's, known."""
    config = config_of(ROOT / "Pulumi.us-west-2.yaml")
    config.pop("eks-ray-train:image")
    with serving_the_program(*the_programs_images("us-west-2")) as registries:
        digests = {reference: registries.push(reference) for reference in the_programs_images("us-west-2")}
        plan = run_program(config, FakeAws(region="us-west-2"), stack="us-west-2", first_preview=True)
    releases = plan.of_type("kubernetes:helm.sh/v3:Release")
    shown = {
        f"{r.inputs['values']['image']['repository']}:{r.inputs['values']['image']['tag']}" for r in releases
    }
    ray = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["headGroupSpec"]["template"]["spec"]
    reader = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters").inputs["spec"]["template"]["spec"]
    pinned = {f"{reference}@{digest}" for reference, digest in digests.items()}
    assert (
        len(releases) == 3
        and shown | {ray["containers"][0]["image"], reader["containers"][0]["image"]} == pinned
    )
    assert all(
        "@sha256:" in r.inputs["values"]["image"]["tag"] and not unknown_inputs(r.inputs["values"])
        for r in releases
    )
    # The EFA plugin's image is in EKS's registry of the region: read with an ECR token of that region.
    assert registries.ecr_token_reads == [{"region": "us-west-2"}]
