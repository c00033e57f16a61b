"""The TrainingRun dynamic resource: check, diff, CRUD; its outputs are declared once in `outputs`, its
inputs and time limits are the run schema (`schema`).

After the RayCluster exists, `pulumi up` creates this resource; its provider judges the fabric
before the job (`gate`), runs the training job and proves NCCL's transport (`runner`), and its
outputs carry the gate's verdict, the job id, the transport verdict and its evidence, and the
throughput.

Re-runs. `diff` replaces the resource, which runs the job (again), when an input marked `rerun`
changes: the code, the job arguments, what the pods run (`run_spec_hash`: a hash of the rendered
RayCluster: image, NCCL/EFA environment, resources, volumes, node selection; the pods carry it and
the run waits for pods that do; `gpu_instance_type`), the
expected transport, `benchmark`, or where the job runs. `timeout_minutes` alone changes nothing, and
the GPU node group's inputs (`node_group_name`, `gpu_node_count`, `gpu_nodes_after_training`) run no
job: with `release` the run scales the group out before the job and to 0 after it (`runner`), so a
`pulumi up` without a change leaves the group at 0 and the verdict standing, and a group no run
released is released again (below).
An input not known yet counts as changed. The fabric gate runs with the job, never alone: a
`pulumi up` without a change runs neither. The gate's probe job takes its id from the same identity
(`gate-<variant>-...`), so after an interrupted `pulumi up` it is adopted or judged again on the
same pods as the job is. `read` returns the recorded run unchanged (a finished job does not
change); `delete` does nothing: a finished job holds no resources, its history goes with the
RayCluster.

Release again. Under `release`, a GPU node group that no run of these inputs has released is an
update (changes, no replaces) when no job input changed (`RELEASE_INPUTS`): a new `node_group_name`
(the group was replaced: a new `gpuAz`, GPU type or capacity type; pulumi-aws names a replacement
anew, and a preview may not know the name yet), or `gpu_nodes_after_training` switched from `keep`.
`update`, which the engine asks for only then (a diff with replaces is a replacement: pulumi/pulumi
pkg/resource/deploy/step_generator.go, `continueStepsFromDiff`), submits no job: the recorded run's
jobs ended before it was recorded (`create` returns once each job it followed ended), so it scales
the group to 0 and keeps the recorded verdict and outputs, with `gpu_nodes_released_at` the new
release (the recorded one when the group already stood at 0). Not being a replacement also keeps
the TrainingRun out of the node group's delete-before-replace: the engine deletes first only the
dependents whose `Diff`, with the group's outputs unknown, replaces (`calculateDependentReplacements`,
same file). The engine hands `diff` and `update` the resource's recorded outputs as `olds` (DiffRequest
and UpdateRequest `olds`, pulumi/runtime/proto/provider_pb2.pyi: "the old *output* properties"),
which a `pulumi up` without a change keeps (below): a group replaced under an earlier release of
this program, where the run saw no change, is still recorded under its old name and released on the
next `pulumi up`.

Credentials. Inputs are the cluster name and region; inside `create` the provider asks EKS for the
endpoint and signs its own Kubernetes token (`eks_auth`) as the identity of the stack's AWS
settings (`infra.config.aws_identity`), which `configure` reads from the stack config the engine
hands the host. Neither a token nor a kubeconfig reaches inputs or outputs.

The stored provider. The SDK pickles the provider with dill into the resource's `__provider`
(`serialize_provider`, pulumi/dynamic/dynamic.py), storing importable classes and functions by
module and name. `TrainingRunProvider.__reduce__` makes that pickle one name,
`workloads.training_run.provider:TrainingRunProvider`, and nothing of the instance: the host builds
the provider anew and configures it (`get_provider`, pulumi/dynamic/__main__.py), so no setting,
client or secret is stored. `Read` and `Delete` (`pulumi refresh`, `pulumi destroy`) unpickle the
`__provider` of the resource's outputs, written by the release that last created or updated it: a
`pulumi up` without a change keeps the outputs (pulumi/pulumi pkg/resource/deploy/step.go,
`SameStep.Apply`). Earlier releases pickled the instance, which also names `connect_to_eks` here
and `AwsCredentialSettings` in `infra.config.aws_identity` or, before the packages' regrouping
(2026-12-04), in `infra.aws_identity` (a shim); each stays importable where those states look
for it (tests/fixtures/training_run/stored_providers holds a `__provider` of each layout).

Progress and failures. The dynamic provider runs without an engine connection, so
`pulumi.log.info` writes `info: ...` on the provider's stderr, which the CLI shows as diagnostics.
A failure is shown as one message; its traceback goes to the provider's log file
(`engine_host.LOG_FILE`). Ctrl-C stops the wait at once and says the job keeps running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import botocore.exceptions
import kubernetes.client
import pulumi
import pulumi.dynamic

from infra.config.aws_identity import REFUSED, AwsCredentialSettings, AwsSettingsError, caller_identity
from workloads.training_run import engine_host
from workloads.training_run.access.cluster_api import KubernetesCluster
from workloads.training_run.access.ec2_instances import ec2_launch_times
from workloads.training_run.access.eks_auth import aws_client_config, eks_api_client
from workloads.training_run.access.node_group import EksNodeGroup
from workloads.training_run.errors import (
    ApiRefused,
    ApiUnauthorized,
    ApiUnreachable,
    TrainingRunError,
    explain_describe_cluster_failure,
    explain_refused,
    explain_unauthorized,
    explain_unreachable,
    unauthorized_cause,
)
from workloads.training_run.outputs import GATE as GATE
from workloads.training_run.outputs import OUTPUTS as OUTPUTS
from workloads.training_run.outputs import TOP as TOP
from workloads.training_run.outputs import RunOutputs
from workloads.training_run.outputs import benchmark_output_keys as benchmark_output_keys
from workloads.training_run.outputs import training_output_keys as training_output_keys
from workloads.training_run.runner import RunEnvironment, TrainingRunner
from workloads.training_run.schema import (
    RELEASE,
    RERUN_INPUTS,
    RunInputs,
    RunTimings,
    input_problems,
    is_known,
)

# --- check and diff ------------------------------------------------------------------------------


# The inputs whose change, under `release`, leaves a GPU node group no run of these inputs released
# ("Release again" in the module doc).
RELEASE_INPUTS = ("node_group_name", "gpu_nodes_after_training")


def _differ(olds: Mapping[str, Any], news: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The `keys` that changed; one that is or holds a value not known yet (`is_known`) differs too."""
    return [key for key in keys if not is_known(news.get(key)) or olds.get(key) != news.get(key)]


def diff_props(olds: Mapping[str, Any], news: Mapping[str, Any]) -> pulumi.dynamic.DiffResult:
    """Replace (run again) when an input of `RERUN_INPUTS` changed; else, under `release`, update
    (release again) when one of `RELEASE_INPUTS` did."""
    changed = _differ(olds, news, RERUN_INPUTS)
    release_again = (
        not changed
        and news.get("gpu_nodes_after_training") == RELEASE
        and bool(_differ(olds, news, RELEASE_INPUTS))
    )
    return pulumi.dynamic.DiffResult(
        changes=bool(changed) or release_again, replaces=changed, stables=[], delete_before_replace=False
    )


# --- the connection to the cluster ------------------------------------------------------------------


@contextlib.contextmanager
def connect_to_eks(
    inputs: RunInputs, aws: AwsCredentialSettings, timings: RunTimings
) -> Iterator[RunEnvironment]:
    """The real environment: a Kubernetes client for the EKS cluster, pods reached by exec."""
    try:
        session = aws.session(inputs.region)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        raise TrainingRunError(
            f"the stack's AWS settings ({aws.describe()}) give no usable credentials: {error}"
        ) from error
    cluster: KubernetesCluster | None = None
    try:
        node_group = (
            EksNodeGroup(
                session.client("eks", region_name=inputs.region, config=aws_client_config(timings.api)),
                inputs.cluster_name,
                inputs.node_group_name,
                inputs.region,
            )
            if inputs.node_group_name
            else None
        )
        with eks_api_client(inputs.cluster_name, inputs.region, session, timings.api) as api_client:
            cluster = KubernetesCluster(
                kubernetes.client.CoreV1Api(api_client),
                kubernetes.client.CustomObjectsApi(api_client),
                api_client.configuration.host,
                timings.api,
                engine_host.CANCELLED,
            )
            yield RunEnvironment(
                cluster,
                executor_for=lambda pod: cluster.executor(pod.namespace or inputs.namespace, pod),
                poll_interval_s=timings.poll_interval_s,
                readiness_timeout_s=timings.readiness_timeout_s,
                code_sync_timeout_s=timings.code_sync_timeout_s,
                sleep=engine_host.cancellable_sleep,
                node_group=node_group,
                launch_times=ec2_launch_times(
                    session.client("ec2", region_name=inputs.region, config=aws_client_config(timings.api)),
                    aws.describe(),
                ),
            )
    except ApiUnauthorized as error:
        arn, sts_error = caller_identity(session, inputs.region, aws_client_config(timings.api))
        cause = unauthorized_cause(sts_error, cluster is not None and cluster.accepted)
        raise explain_unauthorized(error, inputs.cluster_name, arn or aws.describe(), cause) from error
    except ApiUnreachable as error:
        raise explain_unreachable(error, inputs.cluster_name) from error
    except ApiRefused as error:
        raise explain_refused(error, inputs.cluster_name) from error
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        raise explain_describe_cluster_failure(
            error, inputs.cluster_name, inputs.region, aws.describe()
        ) from error


Connect = Callable[
    [RunInputs, AwsCredentialSettings, RunTimings], contextlib.AbstractContextManager[RunEnvironment]
]


# --- the dynamic provider and resource ----------------------------------------------------------------


class TrainingRunProvider(pulumi.dynamic.ResourceProvider):
    """CRUD of `TrainingRun`; `connect` opens the environment a run talks to (see module doc)."""

    def __init__(self, connect: Connect = connect_to_eks) -> None:
        super().__init__()
        self._connect = connect
        self._aws = AwsCredentialSettings()
        self._aws_problem: AwsSettingsError | None = None

    def __reduce__(self) -> tuple[type[TrainingRunProvider], tuple[()]]:
        """Pickled as the class's name alone (see "The stored provider" in the module doc): the host
        builds it with `connect_to_eks` and `configure` gives it the stack's AWS settings."""
        return TrainingRunProvider, ()

    def configure(self, req: pulumi.dynamic.ConfigureRequest) -> None:
        """Hook the host (`engine_host`) and read the stack's AWS identity settings."""
        engine_host.install()
        keys = [
            f"aws:{key}"
            for key in ("profile", "accessKey", "secretKey", "token", "assumeRole", "assumeRoles")
        ]
        config = {key: value for key in [*keys, *REFUSED] if (value := req.config.get(key)) is not None}
        try:
            self._aws, self._aws_problem = AwsCredentialSettings.from_config(config), None
        except AwsSettingsError as problem:
            self._aws_problem = problem

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [pulumi.dynamic.CheckFailure(key, reason) for key, reason in input_problems(news)]
        if self._aws_problem is not None:
            failures.append(pulumi.dynamic.CheckFailure(self._aws_problem.key, self._aws_problem.reason))
        return pulumi.dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        return diff_props(olds, news)

    def _usable_settings(self) -> AwsCredentialSettings:
        if self._aws_problem is not None:
            raise TrainingRunError(str(self._aws_problem))
        return self._aws

    def _run(self, props: dict[str, Any]) -> dict[str, Any]:
        aws = self._usable_settings()
        inputs = RunInputs.from_props(props)
        with self._connect(inputs, aws, RunTimings.from_env()) as env:
            runner = TrainingRunner(inputs, env)
            main, tcp = runner.run()
            launches = runner.gpu_node_launches()
        outputs = RunOutputs.of(main, tcp, inputs.line_rate_gbps, launches, runner.released_at)
        return {**inputs.props(), **dataclasses.asdict(outputs)}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(uuid.uuid4().hex, self._run(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        """Release again ("Release again" in the module doc): the GPU node group to 0, no job; the
        recorded run (`olds`) stands under the new inputs."""
        aws = self._usable_settings()
        inputs = RunInputs.from_props(news)
        recorded = {name: olds.get(name) for name in OUTPUTS}
        with self._connect(inputs, aws, RunTimings.from_env()) as env:
            sizer = env.node_group
            assert sizer is not None, "checked: node_group_name is required with release"
            env.log(
                f"training run: job {recorded['job_id']} ({recorded['status']}) keeps its verdict: no input of "
                f"the job changed, so no job runs; GPU node group {inputs.node_group_name}, which no run of these "
                "inputs released, goes to 0 (gpuNodesAfterTraining: release)"
            )
            released_at = TrainingRunner(inputs, env).release(sizer)
            if released_at is None:
                env.log(f"training run: GPU node group {inputs.node_group_name} already stands at 0 nodes")
        released = {"gpu_nodes_released_at": released_at} if released_at else {}
        return pulumi.dynamic.UpdateResult({**inputs.props(), **recorded, **released})

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """A refresh keeps the recorded run: a finished job's result does not change."""
        return pulumi.dynamic.ReadResult(id_, props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing to remove: a finished job holds no resources; its history goes with the RayCluster."""


class TrainingRun(pulumi.dynamic.Resource, module="workloads", name="TrainingRun"):
    """The training job of `pulumi up`, its NCCL transport verdict and its throughput (`RunOutputs`)."""

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> pulumi.Output[Any]: ...

    def __init__(
        self,
        name: str,
        inputs: RunInputs,
        opts: pulumi.ResourceOptions | None = None,
        *,
        node_group_name: pulumi.Input[str] | None = None,
    ) -> None:
        """`node_group_name`: the GPU node group's, known only once the group exists, so given as an
        Output beside the typed inputs; it becomes the `node_group_name` input."""
        props: dict[str, Any] = {**inputs.props(), **dict.fromkeys(OUTPUTS)}
        if node_group_name is not None:
            props["node_group_name"] = node_group_name
        super().__init__(TrainingRunProvider(), name, props, opts)
