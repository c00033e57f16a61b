"""Stack settings: defaults, parsing, and bad input that must fail naming the key and the fix."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from infra.aws_facts.sizing import InstanceFacts, size_workers
from infra.config.stack import AwsIdentity, ConfigError, parse_settings
from infra.config.training_settings import PROGRAM_FLAGS, key_of_flag, setting_flags, setting_keys
from training.config.run_config import PRESETS, build_parser, parse_flags

CIDRS = {"endpointPublicAccessCidrs": '["203.0.113.7/32"]'}
G6_12XLARGE = InstanceFacts(
    "g6.12xlarge",
    vcpus=48,
    memory_mib=196_608,
    gpus=4,
    gpu_name="NVIDIA L4",
    gpu_memory_mib=91_552,
    efa_supported=True,
    efa_interfaces=1,
    network_cards=1,
    max_pods=234,
)


def parse(**values):
    return parse_settings({**CIDRS, **values}, "us-east-2", stack="dev")


def test_defaults_are_the_reference_setup():
    settings = parse()
    assert (settings.gpu_node_type, settings.gpu_node_count) == ("g6.12xlarge", 2)
    assert (settings.system_node_type, settings.system_node_count) == ("m7i.xlarge", 1)
    assert (settings.worker_cpu, settings.worker_memory) == (40, "160Gi")
    assert settings.kubernetes_version == "1.36"
    assert settings.image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert settings.ray_version == "2.58.0"
    assert settings.train and not settings.benchmark
    assert settings.training.expect_transport == "efa"


def test_values_arrive_as_engine_text():
    settings = parse(
        gpuNodeCount="3",
        train="false",
        training='{"steps": 7, "learningRate": 1e-4, "hsdpReplicas": "auto", "compile": "false"}',
    )
    assert settings.gpu_node_count == 3 and settings.train is False
    assert settings.training.flags == (
        *("--preset", "smoke", "--steps", "7", "--lr", "0.0001"),
        *("--hsdp-replicas", "auto", "--no-compile"),
    )


@pytest.mark.parametrize(
    "values, message",
    [
        ({"gpuNodeCount": "0"}, "'gpuNodeCount' = '0': must be at least 1"),
        ({"gpuNodeCount": "two"}, "'gpuNodeCount' = 'two': expected a whole number"),
        ({"gpuNodeType": "G6 12xlarge"}, "'gpuNodeType'"),
        ({"vpcCidr": "10.0.0.0/33"}, "'vpcCidr' = '10.0.0.0/33': not a CIDR block"),
        ({"vpcCidr": "10.0.0.0/8"}, "between /16 and /20"),
        ({"gpuAz": "us-west-2a"}, "'gpuAz' = 'us-west-2a' is not in region us-east-2"),
        ({"endpointPublicAccessCidrs": '["0.0.0.0/0"]'}, "opens the Kubernetes API to the whole internet"),
        ({"image": "rayproject/ray:latest"}, "pin the image"),
        ({"image": "rayproject/ray"}, "pin the image"),
        ({"capacityReservationId": "reservation-1"}, "'capacityReservationId'"),
        ({"workerMemory": "lots"}, "'workerMemory' = 'lots'"),
        (
            {"workerMemory": "160 Gi"},
            "'workerMemory' = '160 Gi': '160 Gi' is not a Kubernetes memory quantity",
        ),
        ({"workerMemory": "-1Gi"}, "'workerMemory' = '-1Gi': '-1Gi' is not a Kubernetes memory quantity"),
        ({"image": "rayproject/ray@sha256:abc"}, "pin the image"),
        ({"train": "yes"}, "'train' = 'yes': expected true or false"),
        (
            {"training": '{"preset": "fast"}'},
            "'training.preset' = 'fast': invalid choice: 'fast' (choose from 'smoke', 'throughput', 'tiny')",
        ),
        ({"training": '{"seqLen": 0}'}, "'training.seqLen' = 0: must be >= 1, got 0"),
        (
            {"training": '{"seqLen": "long"}'},
            "'training.seqLen' = 'long': expected a whole number >= 1, got 'long'",
        ),
        ({"training": '{"learningRate": -1}'}, "'training.learningRate' = -1: must be > 0, got -1"),
        ({"training": '{"compile": "yes"}'}, "'training.compile' = 'yes': expected true or false, got 'yes'"),
        ({"training": '{"steps": true}'}, "'training.steps' = True: expected a single value, got True"),
        ({"training": '{"steps": [1, 2]}'}, "'training.steps' = [1, 2]: expected a single value"),
        ({"training": '{"steps": null}'}, "'training.steps' = None: expected a single value"),
        (
            {"training": '{"workers": 6, "hsdpReplicas": 4}'},
            "config key 'training': 6 workers are not a multiple of hsdpReplicas 4",
        ),
        (
            {"training": '{"init": "random", "modelConfig": "tiny", "seqLen": 100000}'},
            "config key 'training': seqLen 100000 exceeds the model's max_position_embeddings",
        ),
        (
            {"training": '{"lr": 1e-4, "learningRate": 2e-4}'},
            "'training.lr' and 'training.learningRate' both set",
        ),
        (
            {"training": '{"modelId": "org/model $(date)"}'},
            "'training.modelId' = 'org/model $(date)': use letters, digits",
        ),
        ({"training": '{"data": "s3://b/my corpus"}'}, "passes through a shell on the cluster"),
        ({"training": '{"expectTransport": "tcp"}'}, "'training.expectTransport'"),
        ({"training": '{"minBusbwFraction": 1.5}'}, "'training.minBusbwFraction'"),
        ({"training": '{"minBusbwFraction": true}'}, "'training.minBusbwFraction'"),
        ({"training": "[1, 2]"}, "'training' must be an object"),
        ({"clusterName": "c" * 44}, f"'clusterName' = '{'c' * 44}': at most 43 characters"),
        ({"clusterName": "-leading-dash"}, "'clusterName'"),
        (
            {"adminPrincipalArns": '"arn:aws:iam::123456789012:role/ci"'},
            "expected a non-empty list of IAM ARNs",
        ),
        ({"adminPrincipalArns": "[]"}, "expected a non-empty list"),
        ({"adminPrincipalArns": '["ci-role"]'}, "'ci-role' is not the ARN of an IAM user or role"),
        (
            {"adminPrincipalArns": '["arn:aws:iam::123456789012:group/admins"]'},
            "not the ARN of an IAM user or role",
        ),
        (
            {"adminPrincipalArns": '["arn:aws:sts::123456789012:assumed-role/ci/run-1"]'},
            "give the role's own ARN, arn:aws:iam::123456789012:role/ci",
        ),
        (
            {
                "adminPrincipalArns": '["arn:aws:iam::123456789012:user/a", "arn:aws:iam::123456789012:user/a"]'
            },
            "arn:aws:iam::123456789012:user/a listed twice",
        ),
        (
            {"logRetentionDays": "31"},
            "'logRetentionDays' = '31': CloudWatch Logs keeps logs for one of 1, 3, 5",
        ),
        ({"logRetentionDays": "0"}, "'logRetentionDays' = '0': must be at least 1"),
        ({"logRetentionDays": "forever"}, "expected a whole number"),
        (
            {"gpuNodesAfterTraining": "scale-to-zero"},
            "'gpuNodesAfterTraining' = 'scale-to-zero': expected one of keep, release",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_fix(values, message):
    with pytest.raises(ConfigError) as raised:
        parse(**values)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "key, suggestion",
    [("gpuNodeCont", "gpuNodeCount"), ("clustername", "clusterName"), ("gpuAZ", "gpuAz")],
)
def test_misspelt_keys_get_the_closest_known_key(key, suggestion):
    with pytest.raises(ConfigError, match=f"unknown config key '{key}': did you mean '{suggestion}'"):
        parse(**{key: "1"})


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("setps", "steps"),
        ("seq_len", "seqLen"),
        ("learningrate", "learningRate"),
        ("hsdpReplica", "hsdpReplicas"),
        ("timeoutMinute", "timeoutMinutes"),
    ],
)
def test_misspelt_training_key_is_named_with_its_object(key, suggestion):
    with pytest.raises(
        ConfigError, match=f"unknown config key 'training.{key}': did you mean '{suggestion}'"
    ):
        parse(training=json.dumps({key: 3}))


def test_the_former_hsdp_key_points_to_hsdp_replicas():
    with pytest.raises(ConfigError) as raised:
        parse(training='{"hsdp": true}')
    message = str(raised.value)
    assert message.startswith("config key 'training.hsdp' is no longer read: ")
    assert "hsdpReplicas: auto" in message and "hsdpReplicas: 1" in message and "\n" not in message


@pytest.mark.parametrize("key", [*(key_of_flag(flag) for flag in PROGRAM_FLAGS), "gpu"])
def test_flags_the_program_sets_are_refused(key):
    flag = setting_keys()[key]
    value = True if flag in ("--use-gpu", "--local") else "1"
    with pytest.raises(
        ConfigError, match=rf"config key 'training\.{key}' is set by the program \(.+\): remove it"
    ):
        parse(training=json.dumps({key: value}))


# Keys whose values are only valid beside another key's (the job refuses them alone).
COMPANIONS = {"deferGradSync": {"gradAccumSteps": 2}}


def example_values(key: str, flag: str) -> list:
    """Values `flag` accepts, as a stack would write them: its presets' values that the stack
    accepts (a preset may hold a value in its internal form, a path may hold a space), else a
    plain word."""
    action = next(action for action in build_parser()._actions if flag in action.option_strings)
    if action.nargs == 0:
        return [True, False]
    if action.choices:
        return list(action.choices)
    in_presets = dict.fromkeys(preset.get(action.dest) for preset in PRESETS.values())
    shaped = SHAPED_EXAMPLES.get(key, ["example"])
    return [value for value in in_presets if value is not None and accepted(key, value)] or shaped


# Keys whose values have a shape a plain word does not meet.
SHAPED_EXAMPLES = {"deadline": ["2099-01-01T00:00:00Z"]}


def accepted(key: str, value) -> bool:
    try:
        parse(training=json.dumps({key: value, **COMPANIONS.get(key, {})}))
    except ConfigError:
        return False
    return True


def test_every_training_flag_is_a_stack_key():
    """Adding a flag to `python -m training` makes it a `training:` key with no other edit: each
    flag the program does not set, written as its camelCase key, gives the job what the flag
    gives on the command line."""
    stack_flags = {flag for flag in setting_keys().values() if flag not in PROGRAM_FLAGS}
    assert {"--steps", "--seq-len", "--hsdp-replicas", "--compile", "--data", "--model-id"} <= stack_flags
    for key, flag in setting_keys().items():
        if flag in PROGRAM_FLAGS:
            continue
        assert key_of_flag(flag) == key or flag == "--lr"  # --lr also answers to --learning-rate
        companions = COMPANIONS.get(key, {})
        for value in example_values(key, flag):
            training = parse(training=json.dumps({key: value, **companions})).training
            cli = [
                *setting_flags(key, value),
                *(extra for other, given in companions.items() for extra in setting_flags(other, given)),
            ]
            on_the_command_line = parse_flags(["--preset", "smoke", *cli], paths_here=False)
            from_the_stack = parse_flags(training.flags, paths_here=False)
            assert replace(from_the_stack, run_name="") == replace(on_the_command_line, run_name=""), key
            dest = next(a.dest for a in build_parser()._actions if flag in a.option_strings)
            if dest != "preset":
                # On a GPU preset: the default (tiny) is CPU-only, which --float8 refuses.
                alone = parse_flags(["--preset", "throughput", *cli], paths_here=False)
                assert getattr(from_the_stack, dest) == getattr(alone, dest), key


def test_deferred_grad_sync_alone_fails_preview_naming_both_keys():
    with pytest.raises(ConfigError, match=r"deferGradSync defers .*: set gradAccumSteps > 1"):
        parse(training=json.dumps({"deferGradSync": True}))


def test_public_endpoint_needs_cidrs():
    with pytest.raises(ConfigError, match="'endpointPublicAccessCidrs' is required"):
        parse_settings({}, "us-east-2", stack="dev")


def test_a_private_endpoint_needs_no_cidrs_and_refuses_them():
    """Whether this machine reaches the private endpoint is the preview's to check (`test_program_day_two.py`)."""
    settings = parse_settings({"endpointPublicAccess": "false"}, "us-east-2", stack="dev")
    assert settings.endpoint_public_access is False and settings.endpoint_public_access_cidrs == ()
    with pytest.raises(
        ConfigError, match=r"'endpointPublicAccessCidrs' limits the public API endpoint.*config rm"
    ):
        parse(endpointPublicAccess="false")
    assert parse(endpointPublicAccess="true").endpoint_public_access


def test_new_keys_defaults_and_values():
    settings = parse()
    assert settings.admin_principal_arns == () and settings.log_retention_days == 30
    assert parse(clusterName="c" * 43).cluster_name == "c" * 43
    admins = ["arn:aws:iam::123456789012:role/platform/ci", "arn:aws-us-gov:iam::123456789012:user/alice"]
    settings = parse(adminPrincipalArns=json.dumps(admins), logRetentionDays="365")
    assert settings.admin_principal_arns == tuple(admins) and settings.log_retention_days == 365
    assert settings.gpu_nodes_after_training == "keep"
    assert parse(gpuNodesAfterTraining="release").gpu_nodes_after_training == "release"


def test_aws_identity_comes_from_the_aws_namespace():
    assert parse_settings(CIDRS, "us-east-2", stack="dev").aws_identity == AwsIdentity()
    role = "arn:aws:iam::123456789012:role/deployer"
    identity = parse_settings(
        CIDRS, "us-east-2", {"profile": "team", "assumeRoles": json.dumps([{"roleArn": role}])}, stack="dev"
    ).aws_identity
    assert identity == AwsIdentity(profile="team", role_arn=role)


@pytest.mark.parametrize(
    "assume_roles, message",
    [
        (
            [{"roleArn": "arn:aws:iam::1:role/a"}, {"roleArn": "arn:aws:iam::1:role/b"}],
            "config key 'aws:assumeRoles': chains 2 roles",
        ),
        ([{"sessionName": "x"}], "config key 'aws:assumeRoles[0]': needs a roleArn"),
    ],
)
def test_aws_role_chains_the_kubeconfig_cannot_follow_are_refused(assume_roles, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(CIDRS, "us-east-2", {"assumeRoles": json.dumps(assume_roles)}, stack="dev")


def test_the_single_assume_role_key_reaches_the_kubeconfig_too():
    role = "arn:aws:iam::123456789012:role/deployer"
    identity = parse_settings(
        CIDRS, "us-east-2", {"assumeRole": json.dumps({"roleArn": role})}, stack="dev"
    ).aws_identity
    assert identity == AwsIdentity(profile=None, role_arn=role)


@pytest.mark.parametrize(
    "aws, key",
    [
        ({"accessKey": "AKIAEXAMPLE", "secretKey": "secret"}, "aws:accessKey"),
        ({"sharedCredentialsFiles": '["/x"]'}, "aws:sharedCredentialsFiles"),
        (
            {"assumeRoleWithWebIdentity": '{"roleArn": "arn:aws:iam::1:role/w"}'},
            "aws:assumeRoleWithWebIdentity",
        ),
    ],
)
def test_aws_settings_the_kubeconfig_cannot_use_are_refused_at_preview(aws, key):
    """The program's Kubernetes provider and the training run act as one identity; what the
    kubeconfig's `aws eks get-token` cannot use fails the preview, naming the key."""
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}': ")) as raised:
        parse_settings(CIDRS, "us-east-2", aws, stack="dev")
    assert "\n" not in str(raised.value) and "secret" not in str(raised.value)


def test_region_is_required():
    with pytest.raises(ConfigError, match="aws:region"):
        parse_settings(CIDRS, None, stack="dev")


def test_worker_sizes_come_from_the_instance():
    worker = size_workers(parse(), G6_12XLARGE)
    assert (worker.gpus, worker.efa_interfaces, worker.cpu, worker.memory) == (4, 1, 40, "160Gi")
    assert worker.node_allocatable_cpu_millis < 48_000
    assert worker.node_allocatable_memory_mib < 196_608


def test_worker_cpu_above_the_node_fails_with_the_numbers():
    with pytest.raises(ConfigError) as raised:
        size_workers(parse(workerCpu="48"), G6_12XLARGE)
    message = str(raised.value)
    assert "'workerCpu' = 48 does not fit a g6.12xlarge node" in message
    assert "48 vCPU" in message and "set workerCpu to 46 or less" in message


def test_worker_memory_above_the_node_fails_with_the_numbers():
    with pytest.raises(
        ConfigError, match=r"'workerMemory' = '190Gi' does not fit .* set workerMemory to \d+Gi or less"
    ):
        size_workers(parse(workerMemory="190Gi"), G6_12XLARGE)


def test_gpu_type_without_gpus_fails():
    """An EFA type without GPUs passes the preflight's EFA check (`infra.preflight`); sizing refuses it."""
    no_gpu = InstanceFacts("c5n.18xlarge", 72, 196_608, 0, None, 0, True, 1, 1, 737)
    with pytest.raises(ConfigError, match="has no GPU"):
        size_workers(parse(), no_gpu)


# --- shapes: whole values only ---------------------------------------------------------------------

# A good value of each key a shape check guards. `$` in a pattern also matches before a trailing
# newline, so each shape must match the whole value: `training.runName: "exp1\n"` would otherwise
# put a second line into the job's command, which Ray runs through a shell on the head pod.
SHAPED_KEYS = {
    "clusterName": "eks-ray-train",
    "kubernetesVersion": "1.36",
    "systemNodeType": "m7i.xlarge",
    "gpuNodeType": "g6.12xlarge",
    "gpuAz": "us-east-2a",
    "capacityReservationId": "cr-0123456789abcdef0",
    "image": "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
    "rayVersion": "2.58.0",
    "namespace": "ray-train",
}
TRAILING = ["\n", "\t", " "]


def test_the_shaped_keys_take_their_good_values():
    parse(**SHAPED_KEYS, adminPrincipalArns=json.dumps(["arn:aws:iam::123456789012:role/ci"]))
    parse(training={"runName": "exp1", "expectTransport": "efa"})
    assert parse(training={"minBusbwFraction": 0.8}).training.min_busbw_fraction == 0.8


@pytest.mark.parametrize("suffix", TRAILING, ids=["newline", "tab", "space"])
@pytest.mark.parametrize("key", sorted(SHAPED_KEYS))
def test_a_shaped_key_with_trailing_whitespace_is_refused_naming_it(key, suffix):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse(**{key: SHAPED_KEYS[key] + suffix})


@pytest.mark.parametrize("suffix", TRAILING, ids=["newline", "tab", "space"])
def test_whitespace_after_a_principal_region_or_run_name_is_refused(suffix):
    with pytest.raises(ConfigError, match="'adminPrincipalArns'"):
        parse(adminPrincipalArns=json.dumps([f"arn:aws:iam::123456789012:role/ci{suffix}"]))
    with pytest.raises(ConfigError, match="'aws:region'"):
        parse_settings(CIDRS, f"us-east-2{suffix}", stack="dev")
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": f"exp1{suffix}"})
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": f"exp1{suffix}rm -rf /"})


@pytest.mark.parametrize("name", ["../other-run", "..", ".", "runs/exp1", "-exp1", "e" * 129])
def test_a_run_name_that_is_not_one_folder_is_refused(name):
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": name})


@pytest.mark.parametrize(
    "image, reason",
    [
        ("public.ecr.aws/deep-learning-containers/Ray:train-ml-cuda-v1.1", "must be lowercase"),
        ("RayProject/ray:2.58.0", "must be lowercase"),
        ("rayproject/ray:2.58.0\tx", "no spaces, tabs or newlines"),
    ],
)
def test_an_image_reference_oci_refuses_is_refused(image, reason):
    with pytest.raises(ConfigError, match=reason):
        parse(image=image)


DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize("stack", ["us-east-1", "prod", "devices", "development"])
@pytest.mark.parametrize(
    "image, problem",
    [
        (None, "(the default) is a tag"),
        ("rayproject/ray:2.58.0-py311-gpu", "is a tag"),
        ("rayproject/ray@sha256:" + "A" * 64, "has a digest other than sha256"),
        ("rayproject/ray@sha512:" + "0" * 128, "has a digest other than sha256"),
    ],
)
def test_a_stack_that_is_not_dev_refuses_an_image_without_a_sha256_digest(stack, image, problem):
    values = {**CIDRS, **({"image": image} if image else {})}
    with pytest.raises(ConfigError) as raised:
        parse_settings(values, "us-east-2", stack=stack)
    refusal = str(raised.value)
    assert refusal.startswith("config key 'image' = ") and problem in refusal, refusal
    assert f"stack {stack!r} is not a dev stack" in refusal and "\n" not in refusal
    for how in ("docker buildx imagetools inspect", "crane digest", "aws ecr describe-images"):
        assert how in refusal
    assert "`pulumi config set image " in refusal and "@sha256:<digest>`" in refusal


@pytest.mark.parametrize("stack", ["dev", "dev-alice", "alice-dev"])
def test_a_dev_stack_may_run_a_tag(stack):
    assert parse_settings(CIDRS, "us-east-2", stack=stack).image.endswith(":train-ml-cuda-v1.1")


def test_an_image_by_digest_runs_on_any_stack_and_keeps_the_default_images_ray_check():
    pinned = f"public.ecr.aws/deep-learning-containers/ray@{DIGEST}"
    assert parse_settings({**CIDRS, "image": pinned}, "us-east-2", stack="prod").image == pinned
    tagged_and_pinned = f"public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1@{DIGEST}"
    with pytest.raises(ConfigError, match=r"the default image carries Ray 2\.58\.0"):
        parse_settings(
            {**CIDRS, "image": tagged_and_pinned, "rayVersion": "2.57.0"}, "us-east-2", stack="prod"
        )
    assert (
        parse_settings({**CIDRS, "image": tagged_and_pinned}, "us-east-2", stack="prod").image
        == tagged_and_pinned
    )


def test_a_registry_host_may_have_capitals():
    assert parse(image="Registry.example.com:5000/team/ray:2.58.0").image.startswith("Registry")


def test_a_namespace_longer_than_a_kubernetes_label_is_refused():
    parse(namespace="n" * 63)
    with pytest.raises(ConfigError, match="'namespace'"):
        parse(namespace="n" * 64)


# --- who may reach the API ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cidrs, reason",
    [
        (["0.0.0.0/0"], "cover every address"),
        (["0.0.0.0/1", "128.0.0.0/1"], "cover every address"),
        (["::/1", "8000::/1"], "cover every address"),
        (["10.0.0.0/16"], "10.0.0.0/16 is within 10.0.0.0/8"),
        (["203.0.113.7/32", "192.168.1.0/24"], "192.168.1.0/24 is within 192.168.0.0/16"),
        (["100.64.0.1/32"], "within 100.64.0.0/10"),
        ([f"198.51.100.{i}/32" for i in range(41)], "41 blocks: EKS takes at most 40"),
    ],
)
def test_public_access_cidrs_eks_would_refuse_or_that_open_everything_are_refused(cidrs, reason):
    with pytest.raises(ConfigError, match="'endpointPublicAccessCidrs'") as raised:
        parse(endpointPublicAccessCidrs=json.dumps(cidrs))
    assert reason in str(raised.value)


def test_forty_public_blocks_are_the_most_eks_takes():
    cidrs = [f"198.51.100.{i}/32" for i in range(40)]
    assert len(parse(endpointPublicAccessCidrs=json.dumps(cidrs)).endpoint_public_access_cidrs) == 40


@pytest.mark.parametrize("key", ["region", "profile", "assumeRole"])
def test_an_aws_setting_in_the_project_namespace_points_to_aws(key):
    with pytest.raises(
        ConfigError, match=f"'eks-ray-train:{key}' is a setting of the AWS provider: set 'aws:{key}'"
    ):
        parse(**{key: "x"})


def test_a_benchmark_without_training_is_refused():
    assert parse(benchmark="true").benchmark
    with pytest.raises(ConfigError, match="'benchmark' = true needs train: true"):
        parse(benchmark="true", train="false")


@pytest.mark.parametrize("region, partition", [("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")])
def test_a_region_outside_the_aws_partition_is_refused_with_the_reason(region, partition):
    with pytest.raises(ConfigError, match=f"'aws:region' = '{region}' is in the {partition} partition"):
        parse_settings(CIDRS, region, stack="dev")


@pytest.mark.parametrize(
    "cidr, reason", [("172.17.0.0/16", "the Docker bridge"), ("169.254.0.0/16", "link-local")]
)
def test_a_vpc_block_aws_warns_against_is_refused(cidr, reason):
    with pytest.raises(ConfigError, match=f"'vpcCidr' = '{cidr}': overlaps {cidr}, {reason}"):
        parse(vpcCidr=cidr)


def test_a_ray_without_token_authentication_is_refused_naming_the_version_it_needs():
    """The RayCluster turns on Ray's token authentication, which KubeRay refuses below Ray 2.52.0
    (kuberay v1.7.0 ray-operator/controllers/ray/utils/validation.go): the preview says so first."""
    with pytest.raises(ConfigError) as caught:
        parse(image="rayproject/ray:2.51.2-py311-gpu", rayVersion="2.51.2")
    assert str(caught.value) == (
        "config key 'rayVersion' = '2.51.2': the RayCluster turns on Ray's token authentication, which "
        "Ray has since 2.52.0 (KubeRay refuses it below): use an image with Ray 2.52.0 or later"
    )
    assert parse(image="rayproject/ray:2.52.0-py311-gpu", rayVersion="2.52.0").ray_version == "2.52.0"
