"""TrainingRun: the post-deploy step of `pulumi up` that judges the fabric, runs the training job and proves NCCL's transport.

One file per concern (each module below; `tests/test_docs.py` checks the list is whole):

- `schema`: the run schema: inputs and time limits, declared once, validated from the declaration;
- `provider`: the dynamic resource: check, diff, CRUD;
- `outputs`: its outputs, declared once, and the stack outputs exported from that declaration;
- `readiness`: when the cluster counts as ready (GPU nodes, pods, shipped code), and the waits;
- `runner`: one run, in order: readiness, gate, job(s), verdict(s);
- `deadline`: whether the job's `--deadline` leaves room for the gate and one checkpointed step;
- `gpu_node_group`: the GPU node group's size under `gpuNodesAfterTraining: release`, out before a run and to 0 after;
- `job_following`: following a job to its end through a head pod's replacement;
- `node_hours`: the GPU nodes' EC2 launch times, which the run's cost counts hours from;
- `attempts`: the job's restarts from a checkpoint, as its run summary reports them;
- `engine_host`: what the stock dynamic-provider host lacks (Cancel, clean errors);
- `errors`: the failures, each a whole message;
- `access.cluster_api`, `access.pod_exec`, `access.commands`, `access.call_bounds`, `access.eks_auth`: the cluster and AWS, with bounded calls (the AWS identity is `infra.config.aws_identity`, shared with the program);
- `access.jobs`: how a job is submitted, adopted and followed (a typed Ray Jobs client over exec);
  `access.head_jobs_api` is the program it runs in the head pod;
- `access.node_group`: the GPU node group's size through the EKS API, which the run owns with `gpuNodesAfterTraining: release`;
- `access.ec2_instances`: the GPU nodes' EC2 instances and launch times, for the run's cost;
- `verdicts.evidence`: the job's logs, the NCCL lines in them, and how the transport verdict is reached;
- `access.efa_counter_reads`: each worker node's EFA counters, read by exec in its node's counter reader;
- `verdicts.efa_counters`, `verdicts.fabric`: what EFA carried during a run, judged from those counters; the fabric probe's numbers;
- `verdicts.gate`: the fabric judged before each job, which a failing fabric never reaches.

The job's command line comes from the stack's `training` settings (`infra.config.training_settings`).
"""

from workloads.training_run.outputs import benchmark_output, training_output
from workloads.training_run.provider import TrainingRun
from workloads.training_run.schema import RunInputs

__all__ = ["RunInputs", "TrainingRun", "benchmark_output", "training_output"]
