"""Decide from NCCL/Ray logs which transport NCCL used between nodes, with the evidence.

A job whose pods start and whose loss goes down proves nothing about EFA: without the EFA device
NCCL silently falls back to TCP sockets and the job still completes, only slower. This module reads
`NCCL_DEBUG=INFO` output (plain, Ray session or Ray driver logs) and classifies the run as one of:

    efa         every inter-node channel went through aws-ofi-nccl with the libfabric efa provider
    socket      some process moved inter-node traffic over TCP (NCCL's socket transport, or
                aws-ofi-nccl on the libfabric tcp/sockets provider)
    ib          inter-node channels went over InfiniBand/RoCE verbs
    intra-node  only P2P/SHM channels: the run never left one machine
    unknown     no NCCL line reveals the transport, or the processes contradict each other

How lines are read and judged (per process, then the run; fallback lines; coverage):
docs/operations/transport-rules.md. Its command line is `workloads.nccl_transport_cli`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from platform_contract import EXPECTABLE_TRANSPORTS
from workloads.nccl_logs import log_lines
from workloads.nccl_names import FAMILY_NAMES, PROVIDER_NAMES, network_family, provider_transport

NETWORK_TRANSPORTS = frozenset({"efa", "socket", "ib"})
EVIDENCE_PER_HOST = 6
EVIDENCE_TOTAL = 24
UNKNOWN_HOST = "unknown-host"

_LINES_KEPT_PER_KIND = 3  # per process and kind of line: bounds memory on huge logs

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RAY_DEDUP_SUFFIX = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_RAY_PREFIX = re.compile(r"\((?:[^()\s]+ )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^)\s]+))?\)")
# NCCL's `host:pid:tid [cudaDev]` prefix; the host is empty in logs whose poster (or container) left it out.
_NCCL_ORIGIN = re.compile(r"(?P<host>[A-Za-z0-9][\w.\-]*)?:(?P<pid>\d+):\d+ \[\d+\]")
# The same prefix anonymised past that (`<cluster_name>:919:1150 [0]`, `pod-id:num:num [0]`): no host name.
_ANONYMISED_ORIGIN = re.compile(r"\S*:(?P<pid>[^\s:]+):[^\s:]+ \[\d+\]")
_NCCL_MESSAGE = re.compile(r"\bNCCL (?:INFO|WARN) (?P<message>.*)$")
_NCCL_BARE_VERSION = re.compile(r"^NCCL version \d")

_CHANNEL = re.compile(r"^(?:Channel|Ring|CollNet) \d+(?:/\d+)? : .*?\bvia (?P<path>\S.*)$")
_ANNOUNCED_NETWORK = re.compile(
    r"^(?:Using network (?P<using>.+?)|Assigned NET plugin (?P<assigned>.+?) to comm)\s*$"
)
_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (?P<provider>[^\s,]+)")
# `comm 0x.. rank R nranks N ... - Init START|COMPLETE` (every version, after the init function's
# name from 2.21) and `comm 0x.. rank R nRanks N nNodes M ...` (from 2.20).
_COMMUNICATOR = re.compile(
    r"\bcomm 0x[0-9a-f]+ rank \d+ n[Rr]anks (?P<ranks>\d+)(?: nNodes (?P<nodes>\d+))?\b"
)
# Lines that explain a fallback to TCP, strongest first: the evidence shows the first two a process has.
_FALLBACK_HINTS = (
    # why aws-ofi-nccl gave up, then that it did
    re.compile(r"^NET/OFI (?:Only EFA provider is supported|No eligible providers)"),
    re.compile(r"^NET/OFI .*initialization failed"),
    # TCP chosen on purpose
    re.compile(r"^NCCL_NET(?:_PLUGIN)? set by environment to (?:Socket|none)"),
    # NCCL's side of a plugin that did not load
    re.compile(r"^NET/OFI Initializing plugin failed|^Failed to initialize NET plugin "),
    re.compile(r"^NET/Plugin\s?: .*(?:Could not find|No plugin found|failed|internal)", re.I),
    re.compile(r"^NET/IB : No device found"),
    re.compile(r"^(?:Initialized NET plugin Socket|NET/Socket : Using )"),
)
# NCCL probing a plugin for the versions it knows (`Failed to find ncclCollNetPlugin_v10 symbol.`): routine
# whenever a plugin lacks CollNet or an interface version, so it explains nothing.
_PLUGIN_PROBE = re.compile(r"^NET/Plugin\s?: ?Failed to find nccl\w*Plugin")
_COLLNET = "COLLNET/"


@dataclass(frozen=True)
class Verdict:
    """The transport of a run and the log lines that decided it.

    `evidence` is bounded and ordered (hosts sorted, lines in log order); `by_host` holds the
    same lines per host; `processes` maps each NCCL process (`host:pid`) to its own transport.
    `confidence` is `high` when channel lines decided, `low` when only init lines
    (`Using network`, provider, `nNodes`) did, `none` for `unknown`.
    """

    transport: str
    reason: str
    confidence: str
    evidence: list[str] = field(default_factory=list)
    by_host: dict[str, list[str]] = field(default_factory=dict)
    processes: dict[str, str] = field(default_factory=dict)

    def ok(self, expect: str | None = None) -> bool:
        """Whether the run meets `expect`; without one, whether a network transport was found.

        `unknown` is a verdict, never met: a log that tells nothing proves nothing.
        """
        if expect is None:
            return self.transport in NETWORK_TRANSPORTS
        return expect in EXPECTABLE_TRANSPORTS and self.transport == expect

    def covering(self, ranks: int, hosts: int) -> Verdict:
        """This verdict if its processes cover the run's `ranks` processes on `hosts` hosts.

        Else efa, ib or intra-node becomes `unknown`, naming what is missing: a process whose lines
        were not read may have fallen back to TCP. `socket` stands, since one process over TCP
        already makes the run socket.

        Processes count by the host names of their lines (`_coverage`; the docs page's rules).
        """
        judged, judged_hosts, hostless = _coverage(self.processes)
        missing = [
            f"{expected - seen} of {expected} {what}"
            for what, expected, seen in (("ranks", ranks, len(judged)), ("hosts", hosts, judged_hosts))
            if seen < expected
        ]
        if not missing or self.transport in {"socket", "unknown"}:
            return self
        counted = " (lines without a host name count as one host)" if hostless else ""
        reason = (
            f"the lines of only {len(judged)} NCCL processes on {judged_hosts} hosts{counted} tell their "
            f"transport ({self.transport}: {self.reason}); nothing tells it for {' and '.join(missing)}"
        )
        return replace(self, transport="unknown", reason=reason, confidence="none")

    def to_json(self, expect: str | None = None) -> dict:
        """The CLI's JSON object; `expect` only changes `ok`."""
        return {
            "transport": self.transport,
            "ok": self.ok(expect),
            "expect": expect,
            "confidence": self.confidence,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "by_host": {host: list(lines) for host, lines in self.by_host.items()},
            "processes": dict(self.processes),
        }


@dataclass(frozen=True)
class _Line:
    """One NCCL log line: its position in the input, its host, and the cleaned text.

    `key` is the line from NCCL's own `host:pid:tid` prefix on (else from Ray's prefix on),
    so the same line seen twice, in a worker's log and Ray-prefixed in the driver's, counts once.
    """

    order: int
    host: str
    text: str
    key: str


@dataclass
class _Process:
    """What one NCCL process (host:pid) said about its transports, a few lines per kind."""

    host: str
    net_channels: dict[str, list[_Line]] = field(default_factory=dict)
    local_channels: list[_Line] = field(default_factory=list)
    announced: dict[str, list[_Line]] = field(default_factory=dict)
    providers: dict[str, list[_Line]] = field(default_factory=dict)
    max_nodes: int | None = None
    node_count_line: _Line | None = None
    max_ranks: int | None = None
    rank_count_line: _Line | None = None
    fallback_hints: dict[int, list[_Line]] = field(default_factory=dict)  # by strength, 0 strongest

    @property
    def spans_nodes(self) -> bool:
        return self.max_nodes is not None and self.max_nodes > 1

    def explaining(self, count: int = 2) -> tuple[_Line, ...]:
        """The `count` strongest lines that explain a fallback to TCP (`_FALLBACK_HINTS`)."""
        strongest = (
            line for strength in sorted(self.fallback_hints) for line in self.fallback_hints[strength]
        )
        return tuple(strongest)[:count]


@dataclass(frozen=True)
class _ProcessVerdict:
    transport: str
    from_channels: bool
    lines: tuple[_Line, ...]
    why: str


def _keep(lines: list[_Line], line: _Line) -> None:
    if len(lines) < _LINES_KEPT_PER_KIND and all(kept.key != line.key for kept in lines):
        lines.append(line)


class _LogReader:
    """Accumulates NCCL lines per process; feed it lines in order, then call `verdict`."""

    def __init__(self) -> None:
        self._processes: dict[str, _Process] = {}
        self._order = 0
        self.nccl_lines = 0

    def feed(self, raw: str) -> None:
        self._order += 1
        if "NCCL" not in raw:
            return
        line = _RAY_DEDUP_SUFFIX.sub("", _ANSI_ESCAPE.sub("", raw)).strip()
        found = _NCCL_MESSAGE.search(line)
        if found is None:
            if _NCCL_BARE_VERSION.match(line):
                self.nccl_lines += 1
            return
        self.nccl_lines += 1
        head = line[: found.start()]
        origin = _NCCL_ORIGIN.search(head)
        ray = _RAY_PREFIX.search(head)
        anonymised = _ANONYMISED_ORIGIN.search(head) if origin is None else None
        if origin is not None and origin["host"]:
            host, pid, key = origin["host"], origin["pid"], line[origin.start() :]
        elif ray is not None:
            host, pid, key = ray["ip"] or UNKNOWN_HOST, ray["pid"], line[ray.start() :]
        elif origin is not None:  # `:pid:tid [0]`: a host name left out
            host, pid, key = UNKNOWN_HOST, origin["pid"], line[origin.start() :]
        elif anonymised is not None:  # `<cluster_name>:...`, `pod-id:num:num [0]`: pid kept if it is one
            pid = anonymised["pid"] if anonymised["pid"].isdigit() else ""
            host, key = UNKNOWN_HOST, line[anonymised.start() :]
        else:
            host, pid, key = UNKNOWN_HOST, "", line
        process = self._processes.setdefault(f"{host}:{pid}" if pid else host, _Process(host))
        self._record(process, found["message"].strip(), _Line(self._order, host, line, key))

    @staticmethod
    def _record(process: _Process, message: str, line: _Line) -> None:
        channel = _CHANNEL.match(message)
        if channel is not None:
            parts = channel["path"].split("/")
            if parts[0] == "NET" and len(parts) > 1:
                _keep(process.net_channels.setdefault(network_family(parts[1]), []), line)
            elif parts[0] == "COLLNET" and len(parts) > 1:  # in-network reduction (SHARP), no NET plugin
                _keep(process.net_channels.setdefault(_COLLNET + parts[1].strip(), []), line)
            elif parts[0] in {"P2P", "SHM"}:
                _keep(process.local_channels, line)
            return
        announced = _ANNOUNCED_NETWORK.match(message)
        if announced is not None:
            name = announced["using"] or announced["assigned"]
            _keep(process.announced.setdefault(network_family(name), []), line)
            return
        provider = _PROVIDER.match(message)
        if provider is not None:
            transport = provider_transport(provider["provider"])
            _keep(process.providers.setdefault(transport, []), line)
            return
        communicator = _COMMUNICATOR.search(message)
        if communicator is not None:
            ranks = int(communicator["ranks"])
            if process.max_ranks is None or ranks > process.max_ranks:
                process.max_ranks, process.rank_count_line = ranks, line
            if communicator["nodes"] is not None:
                nodes = int(communicator["nodes"])
                if process.max_nodes is None or nodes > process.max_nodes:
                    process.max_nodes, process.node_count_line = nodes, line
            return
        if _PLUGIN_PROBE.search(message):
            return
        strength = next((rank for rank, hint in enumerate(_FALLBACK_HINTS) if hint.search(message)), None)
        if strength is not None:
            _keep(process.fallback_hints.setdefault(strength, []), line)

    def verdict(self) -> Verdict:
        host_providers: dict[str, dict[str, list[_Line]]] = {}
        for process in self._processes.values():
            for transport, lines in process.providers.items():
                host_providers.setdefault(process.host, {}).setdefault(transport, []).extend(lines)
        run_providers: dict[str, list[_Line]] = {}
        for providers in host_providers.values():
            for transport, lines in providers.items():
                run_providers.setdefault(transport, []).extend(lines)

        decided = {
            key: judged
            for key, process in sorted(self._processes.items())
            if (judged := _judge(process, host_providers.get(process.host, {}), run_providers))
        }
        spans_nodes = any(p.spans_nodes for p in self._processes.values())
        processes = {key: judged.transport for key, judged in decided.items()}
        if not decided:
            if spans_nodes:
                reason = "communicators span several nodes but no line tells their transport"
            elif self.nccl_lines:
                reason = "NCCL lines found, but none tells the transport (channel or network lines)"
            else:
                reason = "no NCCL lines found: run with NCCL_DEBUG=INFO and pass the worker logs"
            return Verdict("unknown", reason, "none", processes=processes)

        sockets = {key: j for key, j in decided.items() if j.transport == "socket"}
        network = {key: j for key, j in decided.items() if j.transport != "intra-node"}
        if sockets:
            transport, deciders = "socket", sockets
            first = next(iter(sockets.values()))
            reason = (
                f"{len(sockets)} of {len(decided)} NCCL processes used TCP sockets between "
                f"nodes ({first.why})"
            )
        elif network:
            kinds = sorted({j.transport for j in network.values()})
            deciders = network
            if len(kinds) == 1:
                transport = kinds[0]
                first = next(iter(network.values()))
                hosts = len({self._processes[key].host for key in network})
                reason = f"{len(network)} NCCL processes on {hosts} hosts: {first.why}"
            else:
                transport = "unknown"
                reason = "NCCL processes disagree on the network transport: " + "; ".join(
                    f"{key} {j.why}" for key, j in network.items()
                )
        elif spans_nodes:
            transport, deciders = "unknown", decided
            reason = "only P2P/SHM channel lines, yet communicators span several nodes"
        elif len(decided_hosts := _hosts(decided)) > 1:
            transport, deciders = "unknown", decided
            reason = (
                f"NCCL processes on {len(decided_hosts)} hosts show only P2P/SHM channels: no line tells how "
                "the hosts talk to each other"
            )
        else:
            transport, deciders = "intra-node", decided
            reason = (
                "only P2P/SHM channels, nNodes 1 or communicators of one rank: no traffic left the machine"
            )

        if transport == "unknown":
            confidence = "none"
        elif any(j.from_channels for j in deciders.values()):
            confidence = "high"
        else:
            confidence = "low"
            reason += "; no channel lines, so decided from init lines only"
        by_host = self._evidence_by_host(deciders)
        evidence = [line for lines in by_host.values() for line in lines][:EVIDENCE_TOTAL]
        return Verdict(transport, reason, confidence, evidence, by_host, processes)

    @staticmethod
    def _evidence_by_host(deciders: dict[str, _ProcessVerdict]) -> dict[str, list[str]]:
        """The deciding lines per host that printed them, bounded, shown in log order.

        Processes decided by channel lines contribute first, so the strongest lines survive
        the bound.
        """
        ranked = sorted(
            deciders.values(),
            key=lambda judged: (not judged.from_channels, min(line.order for line in judged.lines)),
        )
        chosen: dict[str, dict[str, _Line]] = {}
        for judged in ranked:
            for line in judged.lines:
                lines = chosen.setdefault(line.host, {})
                if len(lines) < EVIDENCE_PER_HOST:
                    lines.setdefault(line.key, line)
        return {
            host: [line.text for line in sorted(lines.values(), key=lambda line: line.order)]
            for host, lines in sorted(chosen.items())
        }


def _hosts(processes: Iterable[str]) -> set[str]:
    """The hosts of processes keyed `host:pid`; lines without any host prefix name none."""
    return {key.rsplit(":", 1)[0] for key in processes} - {UNKNOWN_HOST}


def _coverage(processes: Iterable[str]) -> tuple[list[str], int, bool]:
    """The processes (keyed `host:pid`) that count for coverage, on how many hosts, and whether they are
    host-less ones: those with a host name; else, in a log none of whose lines names a host, all of them,
    on one host (the log's own)."""
    keys = list(processes)
    named = [key for key in keys if key.rsplit(":", 1)[0] != UNKNOWN_HOST]
    if named or not keys:
        return named, len(_hosts(named)), False
    return keys, 1, True


def _named(source: str, family: str) -> str:
    """A network as a reason names it: `channels via NET/IB`, `Using network Socket`, or, for a CollNet
    channel (`CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA`), `CollNet channels via COLLNET/SHARP`."""
    return f"CollNet channels via {family}" if family.startswith(_COLLNET) else f"{source}{family}"


def _judge(
    process: _Process,
    host_providers: dict[str, list[_Line]],
    run_providers: dict[str, list[_Line]],
) -> _ProcessVerdict | None:
    """The transport of one process, or None when its lines say nothing about it."""
    may_span_nodes = process.spans_nodes or (process.max_nodes is None and not process.local_channels)
    if process.net_channels:
        families, from_channels, source = process.net_channels, True, "channels via NET/"
    elif process.max_ranks == 1 and process.rank_count_line is not None:
        why = "communicators of one rank only, which move no bytes"
        return _ProcessVerdict("intra-node", False, (process.rank_count_line,), why)
    elif may_span_nodes:
        families, from_channels, source = process.announced, False, "Using network "
    else:
        families, from_channels, source = {}, False, ""
    context = (process.node_count_line,) if process.node_count_line and not from_channels else ()
    if not families and may_span_nodes and "socket" in process.providers:
        # aws-ofi-nccl initialised on a TCP provider: whichever of it or NCCL's own socket transport
        # carried the traffic, it went over TCP. An efa provider line alone proves nothing: NCCL
        # initialises the plugin even when NCCL_NET then picks another network.
        lines = (*process.providers["socket"][:1], *process.explaining(), *context)
        return _ProcessVerdict("socket", False, lines, "aws-ofi-nccl on the libfabric tcp/sockets provider")

    if "socket" in families:
        lines = (*families["socket"][:2], *process.explaining(), *context)
        return _ProcessVerdict("socket", from_channels, lines, f"{source}Socket")
    if len(families) > 1:
        lines = tuple(line for group in families.values() for line in group[:1])
        networks = [family for family in sorted(families) if not family.startswith(_COLLNET)]
        names = [f"{source}{', '.join(FAMILY_NAMES.get(f, f) for f in networks)}"] if networks else []
        names += [_named(source, family) for family in sorted(families) if family.startswith(_COLLNET)]
        return _ProcessVerdict("unknown", from_channels, lines, f"{' and '.join(names)} at once")
    if families:
        ((family, family_lines),) = families.items()
        lines = (*family_lines[:2], *context)
        if family == "ib":
            return _ProcessVerdict("ib", from_channels, lines, f"{source}IB")
        if family.startswith(_COLLNET):
            why = f"{_named(source, family)}, a CollNet plugin this check does not know"
            return _ProcessVerdict("unknown", from_channels, lines, why)
        if family != "libfabric":
            why = f"{source}{family}, a network plugin this check does not know"
            return _ProcessVerdict("unknown", from_channels, lines, why)
        providers = process.providers or host_providers or run_providers
        if not providers:
            why = f"{source}Libfabric, but no 'Selected provider' line tells efa from tcp"
            return _ProcessVerdict("unknown", from_channels, lines, why)
        transport = next(t for t in ("socket", "unknown", "ib", "efa") if t in providers)
        lines += tuple(providers[transport][:1])
        why = f"{source}Libfabric on the libfabric {PROVIDER_NAMES[transport]} provider"
        return _ProcessVerdict(transport, from_channels, lines, why)
    if process.local_channels or process.max_nodes == 1:
        lines = (*process.local_channels[:2], *filter(None, [process.node_count_line]))
        return _ProcessVerdict("intra-node", bool(process.local_channels), lines, "P2P/SHM only")
    return None


def classify_lines(lines: Iterable[str]) -> Verdict:
    """Classify the transport from log lines (any mix of hosts, processes and Ray prefixes)."""
    reader = _LogReader()
    for line in lines:
        reader.feed(line)
    return reader.verdict()


def classify_files(paths: Iterable[str | os.PathLike[str]]) -> Verdict:
    """Classify the transport from log files and folders; raises UnreadableLogError."""
    return classify_lines(log_lines(paths))


if __name__ == "__main__":  # a script that runs this module must not read its silence as a pass
    print("the transport verdict's command is `python -m workloads.nccl_transport_cli`", file=sys.stderr)
    sys.exit(2)
