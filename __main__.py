"""eks-ray-train: EKS + EFA GPU nodes + KubeRay, then a Ray Train FSDP job that must use EFA.

The steps follow AWS's reference example, in its order: configuration, capacity check, network
and cluster, node groups, device plugins, KubeRay, RayCluster, and the training run whose NCCL
transport is checked. This file only reads settings and wires components together.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.aws_rules.image_pins import IMAGE_KEY, RECORD_OUTPUT
from infra.aws_rules.node_repair import ADDON_NAME as NODE_MONITORING_ADDON
from infra.aws_rules.node_repair import REPAIRED_NODE_RECOVERY_S
from infra.aws_rules.sizing import size_workers
from infra.config.pulumi_source import hf_token, load_settings
from infra.config.stack import RELEASE
from infra.config.training_settings import (
    job_arguments,
    job_uris,
    training_config,
    warn_if_the_run_outlasts_its_timeout,
)
from infra.planner.cost import PredictedRun, measured_cost, predicted_cost
from infra.planner.drain import size_the_drain
from infra.planner.figures import line_rate_gbps
from infra.planner.report import log_forecast, measured_against_forecast
from infra.preflight import deadline_of, fit_the_window, place_nodes
from infra.preflight.reads.image_digests import pin_images
from infra.pricing import cost_basis
from infra.resources.cluster import Cluster, addon_version
from infra.resources.network import Network
from infra.resources.node_groups import (
    GPU_ROOT_VOLUME_GIB,
    SYSTEM_ROOT_VOLUME_GIB,
    GpuNodeGroup,
    NodeGroupSpec,
    SystemNodeGroup,
)
from infra.resources.node_health import node_monitoring_agent
from infra.resources.observability import Observability, checked_addon_version
from infra.resources.storage import (
    CheckpointStore,
    checkpoint_bucket_name,
    checkpoint_storage_path,
    granted_prefixes,
)
from platform_contract import RAY_PORTS, RAY_SERVICE_ACCOUNT
from workloads import manifests
from workloads.addons import Addons
from workloads.manifests.charts import chart_images
from workloads.ray_cluster import RayCluster
from workloads.training_run import RunInputs, TrainingRun, benchmark_output, training_output

# 1. Configuration: every key validated, instance facts from AWS, pod sizes derived once.
settings = load_settings()

# 2. Capacity check: offering, EFA, vCPU quota, capacity reservation, and the GPU AZ.
placement = place_nodes(settings)
worker = size_workers(settings, placement.gpu_node)
# The job's command line, one Ray worker per GPU, checked here: a training value that does not fit
# the cluster (say hsdpReplicas that does not divide the world size) stops before any resource.
world_size = settings.gpu_node_count * worker.gpus
bucket_name = checkpoint_bucket_name(settings.cluster_name, settings.region)
code_files = manifests.collect_code(Path(__file__).parent)
line_rate = line_rate_gbps(placement.gpu_node.network_performance)
# The job's --deadline: the reservation's usable end or training.deadline, the earlier.
deadline = deadline_of(settings, placement)
job_args = job_arguments(
    settings.training,
    world_size,
    1,
    checkpoint_storage_path(bucket_name),
    code_files,
    line_rate,
    deadline.at if deadline else None,
    REPAIRED_NODE_RECOVERY_S if settings.gpu_node_auto_repair else None,
)
if settings.train:
    warn_if_the_run_outlasts_its_timeout(settings.training, job_args, placement.gpu_node.gpu_name)
    config = training_config(job_args)
    # The communication forecast: bytes, step time, tokens/s and $ per strategy; warns when network-bound.
    predicted = log_forecast(
        config,
        settings.gpu_node_type,
        settings.gpu_node_count,
        placement.gpu_node.network_performance,
    )
    # The predicted run against that deadline: fits, stops early with a checkpoint, or refused (while
    # the stack has no cluster; with one, warned, and refused by the training run if it runs).
    deadline_check = fit_the_window(settings, placement, deadline, config, predicted)
    # What the run will be billed at (the Price List's answer, or the shipped price it names) and
    # what the stack costs per hour at rest.
    costs = cost_basis(settings, placement, predicted, config.steps)
    # A drain's checkpoint of a node's share to S3, and the worker pods' grace that holds it.
    drain = size_the_drain(config, predicted, settings.gpu_node_count, worker.gpus)

# The images, by digest outside a dev stack: each tag read from its registry at the first deploy's
# preview, then kept from the stack's record while its cluster runs.
images = pin_images(
    {IMAGE_KEY: settings.image, **chart_images(settings.region)},
    stack=pulumi.get_stack(),
    repin=settings.repin_images,
    live=placement.live is not None,
)

# 3. Network and cluster.
network = Network(
    settings.cluster_name,
    cidr=settings.vpc_cidr,
    home_zones=placement.home_azs,
    gpu_zone=placement.gpu_az,
    positional_zones=placement.cluster_azs,
    cluster_name=settings.cluster_name,
    flow_log_retention_days=settings.log_retention_days if settings.vpc_flow_logs else None,
)
cluster = Cluster(
    settings.cluster_name,
    settings=settings,
    vpc_id=network.vpc_id,
    private_subnet_ids=network.private_subnet_ids,
    public_subnet_ids=network.public_subnet_ids,
    live=placement.live,
)

# 4. Node groups: system nodes anywhere private, GPU nodes in the one subnet of the GPU AZ; both at
# the control plane's version, once the role's policies and the NAT routes exist.
system_nodes = SystemNodeGroup(
    "system",
    cluster_name=cluster.cluster_name,
    node_role_arn=cluster.node_role.arn,
    subnet_ids=network.private_subnet_ids,
    spec=NodeGroupSpec(placement.system_node, settings.system_node_count, SYSTEM_ROOT_VOLUME_GIB),
    kubernetes_version=cluster.kubernetes_version,
    after=[*cluster.node_prerequisites, *network.private_egress],
)
gpu_nodes = GpuNodeGroup(
    "gpu",
    cluster_name=cluster.cluster_name,
    vpc_id=network.vpc_id,
    cluster_security_group_id=cluster.security_group_id,
    node_role_arn=cluster.node_role.arn,
    subnet_id=network.gpu_subnet_id,
    zone=placement.gpu_az,
    spec=NodeGroupSpec(
        placement.gpu_node,
        settings.gpu_node_count,
        GPU_ROOT_VOLUME_GIB,
        released=settings.gpu_nodes_after_training == RELEASE,
        trained=settings.train,
    ),
    reservation=placement.reservation,
    kubernetes_version=cluster.kubernetes_version,
    after=[*cluster.node_prerequisites, *network.private_egress],
    auto_repair=settings.gpu_node_auto_repair,
)
# CoreDNS stays at the live add-on's version until kubernetesVersion moves.
coredns = cluster.install_coredns(
    addon_version("coredns", settings.kubernetes_version, placement.live), after=[system_nodes.node_group]
)
# The node monitoring agent whose node conditions the GPU group's auto repair acts on, kept as CoreDNS is.
if settings.gpu_node_auto_repair:
    node_monitoring_agent(
        cluster_name=cluster.cluster_name,
        version=addon_version(NODE_MONITORING_ADDON, settings.kubernetes_version, placement.live),
        after=[system_nodes.node_group, gpu_nodes.node_group],
        parent=cluster,
    )
checkpoints = CheckpointStore(
    "checkpoints",
    bucket_name=bucket_name,
    region=settings.region,
    namespace=settings.namespace,
    oidc_provider_arn=cluster.oidc_provider_arn,
    oidc_provider_url=cluster.oidc_provider_url,
    vpc_id=network.vpc_id,
    route_table_ids=network.private_route_table_ids,
    force_destroy=settings.checkpoints_force_destroy,
    job_uris=job_uris(job_args, granted_prefixes(bucket_name)),
)
# See the run: the CloudWatch Observability add-on on every node, the job's right to publish its
# metrics, and the dashboard of both.
observability = (
    Observability(
        "observability",
        cluster_name=settings.cluster_name,
        eks_cluster_name=cluster.cluster_name,
        region=settings.region,
        addon_version=checked_addon_version(settings.kubernetes_version, placement.live),
        oidc_provider_arn=cluster.oidc_provider_arn,
        oidc_provider_url=cluster.oidc_provider_url,
        ray_pods_role=checkpoints.role,
        after=[system_nodes.node_group, gpu_nodes.node_group],
    )
    if settings.observability
    else None
)

# 5. GPU and EFA device plugins, KubeRay operator and its CRDs, the EFA counter reader; first the
# Ray namespace, with the training code shipped beside it, since the operator's Role lives there.
kubernetes = k8s.Provider(
    "eks",
    kubeconfig=cluster.provider_kubeconfig,
    opts=pulumi.ResourceOptions(parent=cluster, depends_on=[cluster.eks]),
)
# For the KubeRay CRDs alone (see `Addons`): server-side apply, and adopting the CRDs Helm created.
crd_owner = k8s.Provider(
    "eks-crds",
    kubeconfig=cluster.provider_kubeconfig,
    enable_server_side_apply=True,
    upsert_existing_objects=True,
    opts=pulumi.ResourceOptions(parent=cluster, depends_on=[cluster.eks]),
)
ray = RayCluster(
    "ray",
    spec=manifests.RayClusterSpec(
        name="ray-train",
        namespace=settings.namespace,
        image=images[settings.image],
        ray_version=settings.ray_version,
        region=settings.region,
        worker_replicas=settings.gpu_node_count,
        worker=worker,
        service_account=RAY_SERVICE_ACCOUNT,
        code_configmap="training-code",
        code_files=code_files,
        metrics_cluster_name=settings.cluster_name if observability else None,
        **({"worker_grace_s": drain.grace_s} if settings.train else {}),
    ),
    gpu_subnet_cidr=network.gpu_subnet_cidr,
    pod_role_arn=checkpoints.role.arn,
    hf_token=hf_token() if settings.has_hf_token else None,
    provider=kubernetes,
)
addons = Addons(
    "addons",
    provider=kubernetes,
    crd_provider=crd_owner,
    gpu_instance_type=settings.gpu_node_type,
    region=settings.region,
    image=images[settings.image],
    ray_namespace=ray.namespace,
    ray_namespace_object=ray.namespace_object,
    after=[system_nodes.node_group, gpu_nodes.node_group, coredns],
    # The releases' values name each chart image as the preview pinned it.
    chart_pins=images.pinned,
)

# 6. The RayCluster; one Ray worker per GPU.
ray_cluster = ray.create_cluster(after=addons.ready)

# 7. The training run: node and pod checks, the job from the head pod, the NCCL transport verdict.
if settings.train:
    run = TrainingRun(
        "training",
        RunInputs(
            cluster_name=settings.cluster_name,
            region=settings.region,
            namespace=settings.namespace,
            ray_cluster_name=ray.name,
            gpus_per_node=worker.gpus,
            efa_per_node=worker.efa_interfaces,
            code_hash=ray.code_hash,
            run_spec_hash=ray.spec_hash,
            gpu_instance_type=settings.gpu_node_type,
            job_args=tuple(job_args),
            expect_transport=settings.training.expect_transport,
            line_rate_gbps=line_rate,
            min_busbw_fraction=settings.training.min_busbw_fraction,
            check_efa_counters=settings.training.check_efa_counters,
            benchmark=settings.benchmark,
            timeout_minutes=settings.training.timeout_minutes,
            gpu_node_count=settings.gpu_node_count,
            gpu_nodes_after_training=settings.gpu_nodes_after_training,
            not_before=placement.gpus_from.isoformat() if placement.gpus_from else None,
            deadline_check=deadline_check,
            planned=costs.predicted_run,
        ),
        node_group_name=gpu_nodes.node_group.node_group_name,
        # After the Ray pods may write checkpoints and, with observability, publish: the job's
        # metrics from its first step.
        opts=pulumi.ResourceOptions(
            depends_on=[ray_cluster, *checkpoints.ready, *(observability.ready if observability else [])]
        ),
    )
    pulumi.export(
        "training",
        {
            # The run's outputs as `RunOutputs` declares them (`training_output`), with the gate's in
            # `gate`; beside them, the planner's forecast for the configured strategy, the dashboard
            # and the cost.
            **training_output(run),
            "predictedTokensPerS": predicted.tokens_per_s if predicted else None,
            # The forecast the run recorded beside what it measured (`PredictedRun`: not today's
            # planner), also under its former key `planVsMeasured` for one release (UPGRADING.md).
            **dict.fromkeys(
                ("forecastVsMeasured", "planVsMeasured"),
                pulumi.Output.all(run.planned, run.summary).apply(
                    lambda recorded: measured_against_forecast(
                        PredictedRun.recorded(recorded[0], "training.forecastVsMeasured"), recorded[1]
                    )
                ),
            ),
            "dashboard": observability.url if observability else None,
            # An estimate from list prices: the price basis, the planner's prediction and the stack per
            # hour at rest (known at preview), and what the run measured: GPU node hours from launch
            # to their stop, release or the output, their US$ at the price the run recorded, and US$
            # per million tokens.
            "cost": {
                **predicted_cost(costs),
                "measured": pulumi.Output.all(
                    run.planned,
                    run.gpu_nodes,
                    run.gpu_nodes_unavailable,
                    run.finished_at,
                    run.summary,
                    run.gpu_nodes_released_at,
                    run.tcp_summary,
                ).apply(
                    lambda recorded: measured_cost(
                        PredictedRun.recorded(recorded[0], "training.cost.measured"), *recorded[1:]
                    )
                ),
            },
        },
    )
    if settings.benchmark:
        # The EFA run beside the TCP baseline, as `RunOutputs` declares it (`benchmark_output`).
        pulumi.export("benchmark", benchmark_output(run))

pulumi.export("clusterName", settings.cluster_name)
pulumi.export("region", settings.region)
pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("gpuAz", placement.gpu_az)
pulumi.export("gpuSubnetId", network.gpu_subnet_id)
pulumi.export("checkpoints", checkpoints.storage_path)
pulumi.export("codeHash", ray.code_hash)
if images.record:
    # What the next preview keeps the images' digests from.
    pulumi.export(RECORD_OUTPUT, images.record)
if observability:
    pulumi.export("dashboard", observability.url)
dashboard_port = RAY_PORTS["dashboard"]
pulumi.export(
    "rayDashboard",
    f"aws eks update-kubeconfig --region {settings.region} --name {settings.cluster_name} && "
    f"kubectl -n {settings.namespace} port-forward service/{ray.name}-head-svc {dashboard_port}:{dashboard_port}  "
    f"# then open http://localhost:{dashboard_port} and sign in with the token that "
    f"`{manifests.ray_auth_token_command(ray.name, settings.namespace)}` prints",
)
