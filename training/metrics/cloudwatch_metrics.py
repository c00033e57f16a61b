"""The job's metrics as CloudWatch holds them: namespace, names, units and dimensions, declared once.

Rank 0 of the training job and the fabric gate's probe publish them (`training.metrics.cloudwatch_sink`);
the stack's dashboard graphs them and the Ray pods' IAM policy admits `cloudwatch:PutMetricData` to
this namespace alone (`infra.resources.observability`); the RayCluster names the cluster in the
pods' environment (`workloads.manifests`). Standard library only: the Pulumi program imports it at
preview.

The metric names are the fields of the job's `TRAIN_STEP` line (`training.metrics.report.StepMetrics`)
and of the TrainingRun's output (`busbw_gbps`), so one vocabulary reads the log, the stack output and
the dashboard. Units are values of CloudWatch's `StandardUnit` (CloudWatch API Reference,
"MetricDatum"); the tests hold them to botocore's model of the API.
"""

from __future__ import annotations

# A custom namespace: CloudWatch refuses one that starts with "AWS/" (API Reference, "PutMetricData").
NAMESPACE = "EksRayTrain"
# Set on the Ray pods by the RayCluster while the stack's `observability` key is on; without it the
# job publishes nothing (a laptop run, a stack with observability off).
CLUSTER_NAME_ENV = "TRAINING_CLOUDWATCH_CLUSTER_NAME"

# Dimension names. `ClusterName` is Container Insights' own, so one dashboard query filters both.
CLUSTER_DIMENSION = "ClusterName"
RUN_DIMENSION = (
    "RunName"  # the job's --run-name: on the cluster, the Ray job id (`pulumi stack output training`)
)
HOST_DIMENSION = "Host"  # the host name the job's EFA meter reports: the Ray worker pod, one per GPU node
COLLECTIVE_DIMENSION = "Collective"  # all_reduce, all_gather, reduce_scatter

# Each step of a run: the `TRAIN_STEP` field and its unit, with dimensions ClusterName, RunName.
TOKENS_PER_S, LOSS, MFU, STEP_TIME_S = "tokens_per_s", "loss", "mfu", "step_time_s"
STEP_METRICS: dict[str, str] = {
    TOKENS_PER_S: "Count/Second",
    LOSS: "None",
    MFU: "None",  # a fraction of the GPUs' peak, 0 to 1; absent on CPU
    STEP_TIME_S: "Seconds",
}
RUN_DIMENSIONS = (CLUSTER_DIMENSION, RUN_DIMENSION)
# Each step, per node: the bytes its EFA ports moved per second, sent, received and by RDMA read and
# write (`training.metrics.efa_sysfs.MOVED`) (ClusterName, RunName, Host).
EFA_METRIC = "efa_bytes_per_s"
EFA_UNIT = "Bytes/Second"
NODE_DIMENSIONS = (CLUSTER_DIMENSION, RUN_DIMENSION, HOST_DIMENSION)
# Each fabric gate: each collective's busbw at the largest message size it timed, in Gbit/s
# (ClusterName, Collective): the number the gate judges (`workloads.training_run.verdicts.fabric`).
BUSBW_METRIC = "busbw_gbps"
BUSBW_UNIT = "Gigabits/Second"
GATE_DIMENSIONS = (CLUSTER_DIMENSION, COLLECTIVE_DIMENSION)

# Each restart of a run (`training.components.attempts`), once, by the restarted rank 0 after its
# first step: 1, and the steps the fault lost (ClusterName, RunName); a Sum over a run is its restarts
# and the steps they cost.
RESTARTS_METRIC, LOST_STEPS_METRIC = "restarts", "lost_steps"
RESTART_METRICS: dict[str, str] = {RESTARTS_METRIC: "Count", LOST_STEPS_METRIC: "Count"}

# Every metric the job publishes, with its unit and dimensions.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: (unit, RUN_DIMENSIONS) for name, unit in STEP_METRICS.items()},
    **{name: (unit, RUN_DIMENSIONS) for name, unit in RESTART_METRICS.items()},
    EFA_METRIC: (EFA_UNIT, NODE_DIMENSIONS),
    BUSBW_METRIC: (BUSBW_UNIT, GATE_DIMENSIONS),
}
