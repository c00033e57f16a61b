"""The catalogues the documents show, generated from the one declaration of each.

`python -m tools docs` rewrites them in place, each between its markers (`tools/regions.py`), with
the stack keys of docs/configuration.md (`tools/config_tables.py`); `tests/test_docs.py` fails while
a document and the code differ.

- policy/README.md: the policy rules, from the pack's registry (`policy.rules.registered`);
- docs/architecture.md: the Helm chart pins (`workloads.manifests`) and who may import whom (`tools/layers.py`).
"""

from __future__ import annotations

from pathlib import Path

from policy.rules import registered
from policy.rules.registry import MANDATORY, StackRule
from tools import layers
from tools.regions import replace_regions
from workloads.manifests import EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN

ROOT = Path(__file__).resolve().parents[1]
POLICY_README = ROOT / "policy" / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# The Helm charts the program installs, in the order it installs them.
CHARTS = (NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR)


def policy_table() -> str:
    """Every registered rule, the mandatory ones first."""
    rules = sorted(registered(), key=lambda rule: rule.enforcement is not MANDATORY)
    rows = [
        f"| `{rule.name}` | {rule.enforcement.value} | {rule.resources}"
        f"{' (stack rule)' if isinstance(rule, StackRule) else ''} | {rule.requires} |"
        for rule in rules
    ]
    return (
        "| rule | enforcement | resources checked | what it requires |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def chart_table() -> str:
    rows = [f"| {c.name} | {c.version} | {c.repository} | `{c.namespace}` |" for c in CHARTS]
    return (
        "| Helm chart | version | repository | namespace |\n| --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n"
    )


def tables() -> dict[Path, dict[str, str]]:
    """Each document's generated tables by the name of its region."""
    return {
        POLICY_README: {"policy-rules": policy_table()},
        ARCHITECTURE: {"layers": layers.table(), "charts": chart_table()},
    }


def rewritten(document: Path, text: str) -> str:
    """`text`, the document's, with each of its generated tables replaced by the code's."""
    return replace_regions(text, tables()[document], str(document.relative_to(ROOT)))
