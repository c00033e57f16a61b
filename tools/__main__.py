"""`python -m tools docs`: rewrite every generated region and drawn file of the documents from the code;
`python -m tools docs --check`: write nothing, fail naming each stale document."""

from __future__ import annotations

import argparse
import sys

from tools import docs
from tools.catalogues import ROOT
from tools.regions import MissingRegion


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("docs", help="rewrite every generated region of the documents")
    generate.add_argument(
        "--check", action="store_true", help="write nothing; fail while a document is stale"
    )
    arguments = parser.parse_args(argv)
    try:
        if arguments.check:
            stale = docs.stale()
            for document in stale:
                print(f"{document.relative_to(ROOT)} is stale: run `python -m tools docs`", file=sys.stderr)
            return 1 if stale else 0
        for document in docs.write():
            print(f"wrote {document.relative_to(ROOT)}")
    except MissingRegion as missing:
        print(missing, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
