"""The command line of the transport verdict (`workloads.nccl_transport`): its arguments and `main`.

    python -m workloads.nccl_transport_cli [--expect efa] [--ranks N] [--hosts N] LOGFILE|DIR|- ...

It exits 0 when the expectation holds, 1 when not, 2 on bad arguments or unreadable input.
Standard library only, as the verdict's module is.
"""

from __future__ import annotations

import argparse
import json
import sys

from platform_contract import EXPECTABLE_TRANSPORTS
from workloads.nccl_logs import UnreadableLogError
from workloads.nccl_transport import classify_files


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.nccl_transport_cli",
        description="Tell from NCCL_DEBUG=INFO logs which transport NCCL used between nodes; "
        "prints one JSON object.",
        epilog="Exit status: 0 when the expectation holds (without --expect: a network "
        "transport efa/socket/ib was found), 1 when it does not, 2 on bad arguments or "
        "unreadable input.",
    )
    parser.add_argument(
        "--expect",
        choices=EXPECTABLE_TRANSPORTS,
        help="the transport the run must have used (exit 1 otherwise)",
    )
    parser.add_argument(
        "--ranks",
        type=_positive_int,
        default=1,
        help="the run's number of NCCL processes (its world size): fewer judged ones make it unknown",
    )
    parser.add_argument(
        "--hosts",
        type=_positive_int,
        default=1,
        help="the run's number of hosts: fewer judged ones make it unknown",
    )
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOGFILE",
        help="NCCL/Ray log files, folders to walk for *.log/*.out/*.err, or - for stdin",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    args = argument_parser().parse_args(argv)
    try:
        verdict = classify_files(args.logs).covering(args.ranks, args.hosts)
    except UnreadableLogError as error:
        print(f"nccl_transport: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_json(args.expect), indent=2))
    return 0 if verdict.ok(args.expect) else 1


if __name__ == "__main__":
    sys.exit(main())
