"""The provider: diff (what runs the job again, what releases the GPU nodes again), update/delete, the AWS identity settings, no secret in the state, 401 causes."""

from __future__ import annotations

import base64
import json
import pickletools

import dill
import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc

from infra.aws_rules.reservation_window import DeadlineCheck
from infra.config.aws_identity import AwsCredentialSettings
from infra.planner.cost import PredictedRun
from tests.harness import paths
from tests.harness.training_run_fakes import SMOKE_ARGS, FakeCluster, main_and_tcp_head, props, run_inputs
from workloads.training_run import (
    errors,
    provider,
    schema,
)


@pytest.mark.parametrize(
    "key, value",
    [
        ("code_hash", "0000000000000000"),
        ("job_args", [*SMOKE_ARGS, "--steps", "20"]),
        ("benchmark", True),
        ("expect_transport", "socket"),
        ("cluster_name", "other"),
        ("region", "us-west-2"),
        ("namespace", "other"),
        ("ray_cluster_name", "other"),
        ("gpus_per_node", 8),
        ("efa_per_node", 2),
        ("run_spec_hash", "0" * 16),
        ("gpu_instance_type", "g6.48xlarge"),
    ],
)
def test_diff_reruns_when_code_or_training_config_changes(key, value):
    olds = {**props(run_inputs()), "job_id": "eks-ray-train-main-0123456789ab", "status": "SUCCEEDED"}
    result = provider.TrainingRunProvider().diff("id", olds, {**props(run_inputs()), key: value})
    assert result.changes is True and result.replaces == [key]


def test_diff_is_a_noop_otherwise():
    olds = {**props(run_inputs()), "job_id": "eks-ray-train-main-0123456789ab", "tokens_per_s": 531.0}
    olds["gpus_per_node"] = 4.0  # numbers come back from the state as floats
    assert provider.TrainingRunProvider().diff("id", olds, props(run_inputs())).changes is False
    assert (
        provider.TrainingRunProvider()
        .diff("id", olds, {**props(run_inputs()), "timeout_minutes": 90})
        .changes
        is False
    )


def test_diff_reruns_when_an_input_is_not_known_yet():
    news = {**props(run_inputs()), "code_hash": rpc.UNKNOWN}
    assert provider.TrainingRunProvider().diff("id", props(run_inputs()), news).replaces == ["code_hash"]


def test_diff_reruns_when_an_element_of_an_input_is_not_known_yet():
    news = {**props(run_inputs()), "job_args": [*SMOKE_ARGS, "--steps", pulumi.output.Unknown()]}
    assert provider.TrainingRunProvider().diff("id", props(run_inputs()), news).replaces == ["job_args"]


RELEASED = {"node_group_name": "gpu-0a1b2c3", "gpu_node_count": 2, "gpu_nodes_after_training": "release"}


@pytest.mark.parametrize(
    "olds_changes, news_changes",
    [
        ({}, {"node_group_name": "gpu-9z8y7x6"}),  # the group replaced: pulumi-aws names it anew
        ({}, {"node_group_name": rpc.UNKNOWN}),  # ... which a preview may not know yet
        ({"gpu_nodes_after_training": "keep"}, {}),  # kept until now
        ({"gpu_nodes_after_training": None}, {}),  # recorded before gpuNodesAfterTraining existed
    ],
    ids=["replaced-group", "replaced-group-at-preview", "keep-to-release", "older-state"],
)
def test_diff_releases_again_a_group_no_run_released_without_running_the_job(olds_changes, news_changes):
    olds = {**props(run_inputs(**RELEASED)), "job_id": "eks-ray-train-main-0123456789ab", **olds_changes}
    result = provider.diff_props(olds, {**props(run_inputs(**RELEASED)), **news_changes})
    assert result.changes is True and result.replaces == []


def test_diff_replaces_when_a_job_input_changes_beside_the_group():
    """The new run releases the group itself."""
    news = {**props(run_inputs(**RELEASED)), "node_group_name": "gpu-9z8y7x6", "code_hash": "0" * 16}
    assert provider.diff_props(props(run_inputs(**RELEASED)), news).replaces == ["code_hash"]


def test_diff_leaves_a_kept_group_alone():
    """With keep the program sizes the group; a released one that stays is no change either."""
    kept = props(run_inputs(node_group_name="gpu-0a1b2c3"))
    assert provider.diff_props(kept, {**kept, "node_group_name": "gpu-9z8y7x6"}).changes is False
    release_to_keep = {**props(run_inputs(**RELEASED)), "gpu_nodes_after_training": "keep"}
    assert provider.diff_props(props(run_inputs(**RELEASED)), release_to_keep).changes is False
    assert provider.diff_props(props(run_inputs(**RELEASED)), props(run_inputs(**RELEASED))).changes is False


def test_update_releases_the_group_and_keeps_the_recorded_run_and_delete_removes_nothing():
    fake = FakeCluster(main_and_tcp_head())
    run_provider = fake.provider()
    recorded = run_provider.create(props(run_inputs(node_group_name="gpu-0a1b2c3", gpu_node_count=2))).outs
    assert len(fake.head.submissions) == 1 and fake.node_group.sizes == []  # keep: never sized
    fake.clock.now = 3600.0
    news = props(run_inputs(**RELEASED))
    outs = run_provider.update("id", recorded, news).outs
    assert len(fake.head.submissions) == 1 and fake.node_group.sizes == [0]
    assert outs == {
        **recorded,
        **run_inputs(**RELEASED).props(),
        "gpu_nodes_released_at": "2027-01-15T09:00:00Z",
    }
    assert any(
        "keeps its verdict: no input of the job changed, so no job runs" in line for line in fake.logged
    )
    # Already at 0 (a replacement created at 0): nothing to size, the recorded release stands.
    again = run_provider.update("id", outs, {**news, "node_group_name": "gpu-9z8y7x6"}).outs
    assert fake.node_group.sizes == [0] and again["gpu_nodes_released_at"] == "2027-01-15T09:00:00Z"
    assert again["node_group_name"] == "gpu-9z8y7x6" and again["job_id"] == recorded["job_id"]
    assert run_provider.read("id", outs).outs == outs
    assert run_provider.delete("id", outs) is None


# The `module:name`s the provider's pickle may hold. Every name a released pickle holds must stay
# importable where it is for as long as states hold it (the module doc's "The stored provider"), so a
# new one is a path no later release can move.
PICKLED_NAMES = {"workloads.training_run.provider:TrainingRunProvider"}
STORED_PROVIDERS = paths.FIXTURES / "training_run" / "stored_providers"
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_MEMO_GETS = {"GET", "BINGET", "LONG_BINGET"}
_NOT_PUSHING = {"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"}


def pickled_names(payload: str) -> list[str]:
    """The `module:name`s of a `__provider` (base64 of a pickle): each GLOBAL opcode's, and for each
    STACK_GLOBAL the two strings pushed before it, written there or read back from the memo
    (Lib/pickletools.py documents the opcodes)."""
    pushed: list[str | None] = []  # what each pushing opcode put on the stack: a string, else None
    memo: dict[int, str | None] = {}
    names = []
    for opcode, arg, _ in pickletools.genops(base64.b64decode(payload)):
        if opcode.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1]
        elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1]
        elif opcode.name == "GLOBAL":
            names.append(str(arg).replace(" ", ":"))
        elif opcode.name == "STACK_GLOBAL":
            module, name = pushed[-2:]
            assert module is not None and name is not None, "a STACK_GLOBAL whose strings were not read"
            names.append(f"{module}:{name}")
        if opcode.name not in _NOT_PUSHING:
            pushed.append(
                str(arg)
                if opcode.name in _STRINGS
                else memo.get(int(arg))
                if opcode.name in _MEMO_GETS
                else None
            )
    return names


def test_the_stored_provider_names_only_the_declared_names():
    """Fails when the provider's pickle names a `module:name` outside PICKLED_NAMES: a class or function
    that a later release could not move without breaking `pulumi refresh` and `pulumi destroy`."""
    names = pickled_names(serialize_provider(provider.TrainingRunProvider()))
    assert names and set(names) <= PICKLED_NAMES, names


def test_the_guard_reads_the_names_of_an_instance_pickled_whole():
    """The guard itself, on a `__provider` of the release of 2026-12-05, which pickled the instance."""
    stored = (STORED_PROVIDERS / "de86ced.txt").read_text().strip()
    assert sorted(set(pickled_names(stored))) == [
        "infra.config.aws_identity:AwsCredentialSettings",
        "workloads.training_run.provider:TrainingRunProvider",
        "workloads.training_run.provider:connect_to_eks",
    ]


def test_the_provider_this_checkout_stores_is_a_golden_one():
    """The `__provider` this checkout writes is one of tests/fixtures/training_run/stored_providers, whose
    Read and Delete through the host are tested (test_engine_host.py): when it changes, add it there
    (the fixtures' README says how) and keep the older ones."""
    stored = {path.read_text().strip() for path in STORED_PROVIDERS.glob("*.txt")}
    assert serialize_provider(provider.TrainingRunProvider()) in stored


def test_the_stored_provider_holds_nothing_of_the_configured_instance():
    """Static keys in the stack config reach the configured provider, never its pickle: the host builds
    the provider anew (`connect_to_eks`, default settings) and `configure` gives it the settings again."""
    configured = provider.TrainingRunProvider()
    config = {"aws:accessKey": "AKIAEXAMPLEKEY", "aws:secretKey": "s3cr3t-key", "aws:token": "s3ssion-token"}
    configured.configure(pulumi.dynamic.ConfigureRequest(pulumi.dynamic.Config(config, "eks-ray-train")))
    assert configured._aws.secret_key == "s3cr3t-key"
    payload = serialize_provider(configured)
    assert payload == serialize_provider(provider.TrainingRunProvider())
    loaded = dill.loads(base64.b64decode(payload))
    assert isinstance(loaded, provider.TrainingRunProvider) and loaded._connect is provider.connect_to_eks
    assert loaded._aws == AwsCredentialSettings() and loaded._aws_problem is None


def test_the_aws_settings_repr_leaves_the_secret_key_and_session_token_out():
    text = repr(
        AwsCredentialSettings(access_key="AKIAEXAMPLEKEY", secret_key="s3cr3t-key", token="s3ssion-token")
    )
    assert "AKIAEXAMPLEKEY" in text and "s3cr3t" not in text and "s3ssion" not in text


def test_configure_takes_the_stack_aws_profile():
    configured = provider.TrainingRunProvider()
    config = pulumi.dynamic.Config({"aws:profile": "ml-team", "aws:region": "us-east-2"}, "eks-ray-train")
    configured.configure(pulumi.dynamic.ConfigureRequest(config))
    assert configured._aws == AwsCredentialSettings(profile="ml-team")


def test_the_resource_registers_only_names_and_settings():
    registered = []

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            registered.append(args)
            return "run-id", {**args.inputs, "transport": "efa"}

        def call(self, args):
            return {}

    pulumi.runtime.set_mocks(Mocks(), project="eks-ray-train", stack="dev", preview=False)
    transports = []

    @pulumi.runtime.test
    def program():
        # Every input set, so every one is sent (the engine leaves out a null one).
        run = provider.TrainingRun(
            "training",
            run_inputs(
                gpu_node_count=2,
                not_before="2026-12-05T11:30:00Z",
                deadline_check=DeadlineCheck(
                    "training.deadline", "2026-12-05T14:00:00Z", "set it later", 150.0
                ),
                planned=PredictedRun(
                    usd_per_gpu_node_hour=4.6016,
                    price_basis="a list price",
                    step_time_s=1.2,
                    bytes_per_step=3e9,
                ),
            ),
            node_group_name=pulumi.Output.from_input("gpu-0a1b2c3"),
        )
        return run.transport.apply(transports.append)

    program()
    assert transports == ["efa"]
    (args,) = registered
    assert args.typ == "pulumi-python:dynamic/workloads:TrainingRun"
    assert set(args.inputs) == {*schema.INPUTS, "__provider"}  # the declared outputs are null, so not sent
    text = json.dumps({key: value for key, value in args.inputs.items() if key != "__provider"})
    assert "k8s-aws-v1" not in text and "certificate" not in text.lower() and "token" not in text.lower()


def test_aws_settings_are_read_as_the_aws_provider_writes_them():
    chain = [
        {"roleArn": "arn:aws:iam::1:role/a"},
        {"roleArn": "arn:aws:iam::2:role/b", "duration": "1h30m", "externalId": "x"},
    ]
    settings = AwsCredentialSettings.from_config(
        {
            "aws:profile": "ml",
            "aws:assumeRoles": json.dumps(chain),
            "aws:assumeRole": {"roleArn": "arn:aws:iam::0:role/z"},
        }
    )
    assert [role.role_arn for role in settings.roles] == [
        "arn:aws:iam::0:role/z",
        "arn:aws:iam::1:role/a",
        "arn:aws:iam::2:role/b",
    ]
    assert settings.roles[2].request() == {
        "RoleSessionName": "eks-ray-train-training-run",
        "RoleArn": "arn:aws:iam::2:role/b",
        "DurationSeconds": 5400,
        "ExternalId": "x",
    }
    assert settings.profile == "ml" and "role arn:aws:iam::2:role/b" in settings.describe()


@pytest.mark.parametrize(
    "config, key, reason",
    [
        (
            {"aws:assumeRoleWithWebIdentity": '{"roleArn": "r"}'},
            "aws:assumeRoleWithWebIdentity",
            "not honoured",
        ),
        (
            {"aws:sharedCredentialsFiles": '["/x"]'},
            "aws:sharedCredentialsFiles",
            "AWS_SHARED_CREDENTIALS_FILE",
        ),
        ({"aws:accessKey": "AKIA"}, "aws:secretKey", "need both"),
        ({"aws:assumeRole": '{"sessionName": "s"}'}, "aws:assumeRole", "needs a roleArn"),
        ({"aws:assumeRole": '{"roleArn": "r", "mfa": 1}'}, "aws:assumeRole", "field(s) mfa not honoured"),
        (
            {"aws:assumeRoles": '[{"roleArn": "r", "duration": "soon"}]'},
            "aws:assumeRoles[0].duration",
            "not like 1h",
        ),
    ],
)
def test_aws_settings_that_cannot_be_honoured_are_refused_naming_the_key(config, key, reason):
    from infra.config.aws_identity import AwsSettingsError

    with pytest.raises(AwsSettingsError) as caught:
        AwsCredentialSettings.from_config(config)
    assert caught.value.key == key and reason in caught.value.reason


def test_an_unusable_aws_profile_fails_with_one_line_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    settings = AwsCredentialSettings(profile="nope-profile")
    with (
        pytest.raises(errors.TrainingRunError) as caught,
        provider.connect_to_eks(run_inputs(), settings, schema.RunTimings()),
    ):
        pass
    assert str(caught.value) == (
        "the stack's AWS settings (profile nope-profile (aws:profile)) give no usable credentials: "
        "The config profile (nope-profile) could not be found"
    )
