"""TrainingRun: the post-deploy step of `pulumi up` that judges the fabric, runs the training job and proves NCCL's transport.

One file per concern:

- `schema`: the run schema: inputs and time limits, declared once, validated from the declaration;
- `provider`: the dynamic resource: outputs, check, diff, CRUD;
- `readiness`: when the cluster counts as ready (GPU nodes, pods, shipped code), and the waits;
- `jobs`: how a job is submitted, adopted and followed (a typed Ray Jobs client over exec);
  `head_jobs_api` is the program it runs in the head pod;
- `evidence`: the job's logs, the NCCL lines in them, and how the transport verdict is reached;
- `efa_counters`, `fabric`: each worker node's EFA counters around a run; the fabric probe's numbers;
- `gate`: the fabric judged before each job, which a failing fabric never reaches;
- `runner`: one run, in order: readiness, gate, job(s), verdict(s);
- `cluster_api`, `pod_exec`, `commands`, `call_bounds`, `eks_auth`: the cluster and AWS, with bounded calls (the AWS identity is `infra.config.aws_identity`, shared with the program);
- `node_group`: the GPU node group's size through the EKS API, which the run owns with `gpuNodesAfterTraining: release`;
- `engine_host`: what the stock dynamic-provider host lacks (Cancel, clean errors).

The job's command line comes from the stack's `training` settings (`infra.config.training_settings`).
"""

from workloads.training_run.provider import TrainingRun
from workloads.training_run.schema import RunInputs

__all__ = ["RunInputs", "TrainingRun"]
