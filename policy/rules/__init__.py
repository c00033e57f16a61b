"""The pack's rules, one module per area, each rule one object that registers itself (`registry`).

Each rule is a pure function of a resource's properties, so tests call it on hand-written property
dicts and on every resource the program registers under mocks, without a Pulumi engine. Properties
look the way the engine shows them to a policy: camelCase names as the provider sees them, nested
booleans of TF-bridged resources often as the strings "true"/"false", and values that depend on
resources not created yet (during `pulumi preview`) as unknown sentinels. A rule never fails on an
unknown: it checks what is known and leaves the rest to the next preview or `pulumi up`.

The pack runs in its own virtualenv and cannot import the program: the contract values it checks against
(Ray's ports, the GPU node label, the Ray pod labels, the image-pin rule, Kubernetes quantities,
IRSA's annotations and token lifetime, the KMS deletion window, the node role's forbidden policies)
are copies, each checked equal to the original in `tests/policy/test_pack.py`. Pulumi runs
`policy/` as a script, so this package imports as `rules` there and as `policy.rules` in tests:
its modules import each other relatively.
"""

from . import eks, iam, kms, network, nodes, pods, ray, ray_network, storage
from .registry import registered

__all__ = ["eks", "iam", "kms", "network", "nodes", "pods", "ray", "ray_network", "registered", "storage"]
