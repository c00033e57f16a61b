"""Preflight: can this account and region host the stack, and in which zones? Answered in `pulumi preview`.

Every check is a synchronous invoke of the AWS provider, so it runs in `pulumi preview` with the
user's own provider settings, before any resource is registered, and fails with a message that
names the cause and the fix. One module per check; `placement` runs them in order:

- `zones`: the GPU type is offered in a zone of the region EKS can use, and the system type in two
  of them (the EKS control plane needs subnets in two zones; the system nodes run in both);
- `node_types`: an architecture the EKS AMI boots, and EFA on the GPU type (its EFA interface and
  network card counts travel in `Placement.gpu_node`);
- `kubernetes_version`: a version EKS offers in the region;
- `quotas`: the On-Demand vCPU quota of each instance class covers the node groups
  (`gpuNodeCount x vCPU`, 96 for 2 x g6.12xlarge);
- `reservation`: a capacity reservation (`capacityReservationId`) that fits, and decides the GPU zone;
- `subnet_room`: the GPU subnet holds the addresses its nodes take;
- `live_cluster`: the cluster this stack already runs, against the settings it cannot change;
- `window`: the run's deadline and whether the predicted run fits before it.

Judgements live in `infra.aws_rules` (`capacity_rules`, `reservation_window`, `live_stack`); these
modules fetch facts and word the refusals. `infra.preflight.reads` holds the reads other parts of the
program judge too: the live stack, instance types (`infra.aws_rules.sizing`), image digests
(`infra.aws_rules.image_pins`, pinned by `__main__`).
"""

from infra.preflight.errors import PreflightError
from infra.preflight.placement import Placement, place_nodes, utc_now
from infra.preflight.window import deadline_of, fit_the_window

__all__ = ["Placement", "PreflightError", "deadline_of", "fit_the_window", "place_nodes", "utc_now"]
