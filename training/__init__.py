"""Ray Train / torchrun training job: Qwen2.5 with FSDP2 in bf16.

Kept import-light on purpose: the Pulumi program imports `training.metrics.report` and
`training.metrics.flops` to read job logs, and must not pull in torch or ray for that.
"""
