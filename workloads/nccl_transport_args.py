"""The command line's arguments of `python -m workloads.nccl_transport`, whose `main` parses with them.

Standard library only, as the verdict's module is: the Pulumi program imports that without torch or ray.
"""

from __future__ import annotations

import argparse

from platform_contract import EXPECTABLE_TRANSPORTS


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.nccl_transport",
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
