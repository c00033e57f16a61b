"""Entry point of the eks-ray-train policy pack: `pulumi preview --policy-pack policy`.

Pulumi runs this directory as a script, so `rules` (the package beside this file) imports as a
top-level package. Each rule registers itself there; the pack is every registered rule.
"""

from pulumi_policy import PolicyPack
from rules import registered

PolicyPack(
    name="eks-ray-train",
    description="Security and EFA placement guarantees of the eks-ray-train stacks.",
    policies=[rule.to_policy() for rule in registered()],
)
