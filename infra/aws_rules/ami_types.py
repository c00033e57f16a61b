"""The EKS AMI types the node groups boot (EKS API `Nodegroup.amiType`) and the CPU architecture each
is built for: an instance type of another architecture (Graviton's arm64, a Mac) cannot run it. The
node groups name them (`infra.resources.node_groups`); the preview checks the node types against
them (`infra.preflight.node_types`)."""

from __future__ import annotations

SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
AMI_ARCHITECTURE = {SYSTEM_AMI_TYPE: "x86_64", GPU_AMI_TYPE: "x86_64"}
