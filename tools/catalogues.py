"""The catalogues the documents show, generated from the one declaration of each.

`python -m catalogues` rewrites them in place, with the stack keys of docs/configuration.md
(`infra.config.docs_table`); `tests/test_docs.py` fails while a document and the code differ.

- policy/README.md: the policy rules, from the pack's registry (`policy.rules.registered`);
- docs/architecture.md: the Helm chart pins (`workloads.manifests`) and who may import whom (`layers`).
"""

from __future__ import annotations

from pathlib import Path

import layers
from infra.config import docs_table
from infra.config.docs_table import replace_tables
from policy.rules import registered
from policy.rules.registry import MANDATORY, StackRule
from workloads.manifests import EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN

ROOT = Path(__file__).resolve().parent
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
    """Each document's generated tables by the anchor line after which each stands."""
    return {
        POLICY_README: {"## Rules": policy_table()},
        ARCHITECTURE: {
            "above, and a module in no layer fails the test:": layers.table(),
            "The Helm charts, each pinned once in `workloads/manifests/charts.py`:": chart_table(),
        },
    }


def rewritten(document: Path, text: str) -> str:
    """`text`, the document's, with each of its generated tables replaced by the code's."""
    return replace_tables(text, tables()[document])


if __name__ == "__main__":
    for document in tables():
        document.write_text(rewritten(document, document.read_text()))
        print(f"wrote {document}")
    docs_table.CONFIGURATION.write_text(docs_table.rewritten(docs_table.CONFIGURATION.read_text()))
    print(f"wrote {docs_table.CONFIGURATION}")
