"""The NCCL transport check: fixtures of real log formats, decision rules, and the CLI contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.nccl_lines import (
    EFA_PROVIDER,
    ORIGIN_A,
    ORIGIN_B,
    RECEIVE_LIBFABRIC,
    RECEIVE_SOCKET,
    SEND_LIBFABRIC,
    SEND_SOCKET,
    info,
    write_bytes,
)
from tests.harness.paths import REPO_ROOT
from workloads.nccl_transport import (
    EVIDENCE_PER_HOST,
    EVIDENCE_TOTAL,
    Verdict,
    classify_files,
    classify_lines,
)

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "nccl"
POD_A = "eks-ray-train-gpu-workers-worker-4kq9z"
POD_B = "eks-ray-train-gpu-workers-worker-v8m2t"
EFA_DIRECT = "fabric is efa-direct (found 4 nics)"
BUS = "cudaDev 0 nvmlDev 0 busId 65000 commId 0xbd10cc2bcb56e132"


def _comm(rank: int, nodes: int) -> str:
    """NCCL's communicator summary line, which tells how many nodes the communicator spans."""
    return f"comm 0x55d3a1c0 rank {rank} nRanks 8 nNodes {nodes} localRanks 4 localRank 0 MNNVL 0"


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workloads.nccl_transport_cli", *args],
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("fixture", "transport", "confidence", "deciding"),
    [
        (
            "efa_ofi_1_20_ray_session",
            "efa",
            "high",
            ["[send] via NET/Libfabric/0", "Selected provider is efa, fabric is efa (found 1 nics"],
        ),
        (
            "efa_ofi_1_13_nccl_2_21.log",
            "efa",
            "high",
            ["via NET/Libfabric/0", "NET/OFI Selected Provider is efa (found 1 nics)"],
        ),
        (
            "efa_ofi_1_7_aws_libfabric_nccl_2_18.log",
            "efa",
            "high",
            ["via NET/AWS Libfabric/0", "Selected Provider is efa (found 1 nics)"],
        ),
        (
            "efa_gdrdma_efa_direct_nccl_2_27.log",
            "efa",
            "high",
            ["via NET/Libfabric/0/GDRDMA", "fabric is efa-direct (found 32 nics)"],
        ),
        (
            "efa_ray_driver_ansi.log",
            "efa",
            "high",
            ["via NET/Libfabric/0", "Selected provider is efa"],
        ),
        (
            "efa_init_lines_only.log",
            "efa",
            "low",
            ["Using network Libfabric", "Selected provider is efa", "nNodes 2"],
        ),
        (
            "tcp_fallback_plugin_init_failed.log",
            "socket",
            "high",
            [
                "via NET/Socket/0",
                "NET/OFI No eligible providers were found",
                "NET/OFI aws-ofi-nccl initialization failed",
            ],
        ),
        (
            "forced_socket_nccl_net_socket.log",
            "socket",
            "high",
            ["via NET/Socket/0", "NCCL_NET set by environment to Socket"],
        ),
        (
            "mixed_hosts_efa_and_socket.log",
            "socket",
            "high",
            ["via NET/Socket/0", "NET/OFI No eligible providers were found"],
        ),
        (
            "libfabric_over_tcp_provider.log",
            "socket",
            "high",
            ["via NET/Libfabric/0", "Selected provider is tcp, fabric is 192.168.40.0/24"],
        ),
        (
            "single_node_p2p_shm.log",
            "intra-node",
            "high",
            ["via SHM/direct/direct", "via P2P/CUMEM/read", "nNodes 1"],
        ),
        ("ib_infiniband.log", "ib", "high", ["via NET/IB/0/GDRDMA"]),
        ("no_nccl_lines.log", "unknown", "none", []),
        # Logs posted in public issues; each file names its source.
        (  # a communicator of one rank moves no bytes, whatever network it announces
            "single_rank_comm_using_network_ib_nccl_2_18.log",
            "intra-node",
            "low",
            ["rank 0 nranks 1 cudaDev 0"],
        ),
        (  # P2P lines from two hosts say nothing about how the hosts talk
            "p2p_cumem_only_two_hosts_nccl_tests.log",
            "unknown",
            "none",
            [],
        ),
        (  # libfabric's tcp provider under rxm is a TCP path, even before any channel line
            "libfabric_tcp_ofi_rxm_provider_lines.log",
            "socket",
            "low",
            ["NET/OFI Selected Provider is tcp;ofi_rxm"],
        ),
        (  # a prefix without a host name (`:pid:tid [0]`): the process is still one, its ring on IB
            "ib_hostless_prefix_tf_nccl_2_4.log",
            "ib",
            "high",
            [":5202:5683 [0] NCCL INFO Ring 00 : 0 -> 1 [send] via NET/IB/0"],
        ),
        (  # no prefix at all: aws-ofi-nccl on the efa provider, from its init lines
            "efa_no_prefix_nccl_2_9_9_p4d.log",
            "efa",
            "low",
            ["NCCL INFO Using network AWS Libfabric", "NCCL INFO NET/OFI Selected Provider is efa"],
        ),
        (  # an anonymised host name (`<cluster_name>`): processes still told apart by pid
            "socket_anonymised_prefix_nccl_2_18.log",
            "socket",
            "high",
            ["<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3"],
        ),
    ],
)
def test_fixture_is_classified_with_its_deciding_lines(fixture, transport, confidence, deciding):
    verdict = classify_files([FIXTURES / fixture])

    assert (verdict.transport, verdict.confidence) == (transport, confidence), verdict.reason
    for fragment in deciding:
        assert any(fragment in line for line in verdict.evidence), (fragment, verdict.evidence)
    assert bool(verdict.evidence) == bool(verdict.processes)  # the lines of every process judged
    assert not any("\x1b" in line for line in verdict.evidence)


def test_single_node_run_that_printed_using_network_socket_is_intra_node():
    log = (FIXTURES / "single_node_p2p_shm.log").read_text()
    assert "NCCL INFO Using network Socket" in log

    verdict = classify_files([FIXTURES / "single_node_p2p_shm.log"])

    assert verdict.transport == "intra-node"
    assert not any("Using network Socket" in line for line in verdict.evidence)


def test_one_host_on_sockets_makes_the_run_socket_and_only_its_lines_are_evidence():
    verdict = classify_files([FIXTURES / "mixed_hosts_efa_and_socket.log"])

    assert verdict.transport == "socket"
    assert set(verdict.processes.values()) == {"efa", "socket"}
    for process, transport in verdict.processes.items():
        assert transport == ("efa" if process.startswith(POD_A) else "socket"), process
    assert list(verdict.by_host) == [POD_B]
    assert not any(POD_A in line for line in verdict.evidence)


def test_evidence_is_grouped_per_host_bounded_and_ordered():
    verdict = classify_files([FIXTURES / "efa_ofi_1_20_ray_session"])

    assert list(verdict.by_host) == [POD_A, POD_B]
    for host, lines in verdict.by_host.items():
        assert 0 < len(lines) <= EVIDENCE_PER_HOST
        assert all(line.startswith(f"{host}:") for line in lines)
        assert len(set(lines)) == len(lines)
    assert verdict.evidence == verdict.by_host[POD_A] + verdict.by_host[POD_B]
    assert len(verdict.processes) == 8
    assert {process.split(":")[0] for process in verdict.processes} == {POD_A, POD_B}


def test_evidence_prefers_processes_decided_by_channel_lines():
    announced_only = "ip-10-0-1-23:1000:1050 [1]"
    with_channels = "ip-10-0-1-23:2000:2050 [0]"
    channels = [f"Channel {channel:02d}/0 : 7[3] -> 0[0] [receive] via NET/Libfabric/0" for channel in (0, 1)]
    lines = [
        info(announced_only, EFA_PROVIDER),
        info(announced_only, "Assigned NET plugin Libfabric to comm"),
        info(announced_only, "Using network Libfabric"),
        info(announced_only, _comm(rank=1, nodes=2)),
        info(with_channels, EFA_PROVIDER),
        *(info(with_channels, channel) for channel in channels),
    ]

    verdict = classify_lines(lines)

    assert (verdict.transport, verdict.confidence) == ("efa", "high")
    assert len(verdict.evidence) == EVIDENCE_PER_HOST
    for channel in channels:
        assert info(with_channels, channel) in verdict.evidence


def test_reason_tells_missing_nccl_debug_from_uninformative_nccl_lines():
    silent = classify_lines(["step 1/5 loss 12.1"])
    uninformative = classify_lines([info(ORIGIN_A, "cudaDriverVersion 13000")])
    version_only = classify_lines(["NCCL version 2.18.5+cuda12.2"])

    assert "NCCL_DEBUG=INFO" in silent.reason
    assert "none tells the transport" in uninformative.reason
    assert "none tells the transport" in version_only.reason


def test_evidence_stays_bounded_with_many_hosts():
    lines = []
    for node in range(20):
        origin = f"ip-10-0-2-{node}:{100 + node}:{200 + node} [0]"
        lines.append(info(origin, EFA_PROVIDER))
        for channel in range(8):
            message = f"Channel {channel:02d}/0 : {node}[0] -> 0[0] [send] via NET/Libfabric/0"
            lines.append(info(origin, message))

    verdict = classify_lines(lines)

    assert verdict.transport == "efa"
    assert len(verdict.by_host) == 20
    assert len(verdict.evidence) == EVIDENCE_TOTAL
    assert all(len(host_lines) <= EVIDENCE_PER_HOST for host_lines in verdict.by_host.values())


def test_classification_does_not_depend_on_which_file_comes_first():
    session = sorted(p for p in (FIXTURES / "efa_ofi_1_20_ray_session").rglob("*.out"))

    forward, backward = classify_files(session), classify_files(reversed(session))

    assert forward.transport == backward.transport == "efa"
    assert list(forward.by_host) == list(backward.by_host)
    assert forward.processes == backward.processes


@pytest.mark.parametrize(
    ("messages", "transport"),
    [
        ([EFA_PROVIDER, SEND_LIBFABRIC], "efa"),
        ([f"NET/OFI Selected provider is efa, {EFA_DIRECT}", SEND_LIBFABRIC], "efa"),
        ([f"NET/OFI Selected provider is efa-direct, {EFA_DIRECT}", SEND_LIBFABRIC], "efa"),
        (["NET/OFI Selected Provider is sockets (found 1 nics)", SEND_LIBFABRIC], "socket"),
        (["NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)", SEND_LIBFABRIC], "socket"),
        ([SEND_LIBFABRIC], "unknown"),
        (["Channel 00/0 : 3[3] -> 4[0] [send] via NET/Libfabric/1(2)/GDRDMA", EFA_PROVIDER], "efa"),
        (["Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"], "intra-node"),
        (["Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read"], "intra-node"),
        (["Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"], "intra-node"),
        ([_comm(rank=0, nodes=1)], "intra-node"),
        (["Channel 00/0 : 3[3] -> 4[0] [send] via NET/GPUDirectTCPX/0", EFA_PROVIDER], "unknown"),
        (["NCCL version 2.29.7+cuda13.0", "cudaDriverVersion 13000"], "unknown"),
        # One-rank communicators (2.18's `comm ..`, 2.21+'s `ncclCommInitRank comm ..`) move no bytes.
        (["Using network Socket", f"comm 0x1 rank 0 nranks 1 {BUS} - Init COMPLETE"], "intra-node"),
        (
            ["Using network Socket", f"ncclCommInitRank comm 0x1 rank 0 nranks 1 {BUS} - Init START"],
            "intra-node",
        ),
        (["Using network Socket", f"ncclCommInitRank comm 0x1 rank 0 nranks 2 {BUS} - Init START"], "socket"),
        # aws-ofi-nccl on libfabric's tcp provider (FI_PROVIDER=tcp, 1.14+ wording), channels or not.
        (["NET/OFI Selected provider is tcp, fabric is 10.0.0.0/16 (found 1 nics)"], "socket"),
        (
            ["NET/OFI Selected provider is tcp, fabric is 10.0.0.0/16 (found 1 nics)", SEND_LIBFABRIC],
            "socket",
        ),
        # An efa provider line alone is no proof: NCCL initialises the plugin even when NCCL_NET
        # then picks another network.
        ([EFA_PROVIDER], "unknown"),
    ],
)
def test_line_formats(messages, transport):
    verdict = classify_lines(info(ORIGIN_A, message) for message in messages)

    assert verdict.transport == transport, verdict.reason


def test_socket_channels_in_one_process_outvote_efa_in_the_others():
    verdict = classify_lines(
        [
            info(ORIGIN_A, EFA_PROVIDER),
            info(ORIGIN_A, SEND_LIBFABRIC),
            info(ORIGIN_B, RECEIVE_SOCKET),
        ]
    )

    assert verdict.transport == "socket"
    assert verdict.processes == {"ip-10-0-1-23:4711": "efa", "ip-10-0-1-87:5022": "socket"}


def test_multi_node_process_without_channel_lines_is_judged_by_using_network():
    verdict = classify_lines(
        [
            info(ORIGIN_A, EFA_PROVIDER),
            info(ORIGIN_A, SEND_LIBFABRIC),
            info(ORIGIN_B, "Using network Socket"),
            info(ORIGIN_B, _comm(rank=4, nodes=2)),
            info(ORIGIN_B, "Channel 00/0 : 4[0] -> 5[1] via SHM/direct/direct"),
        ]
    )

    assert verdict.transport == "socket"
    assert verdict.confidence == "low"
    assert any("Using network Socket" in line for line in verdict.evidence)


def test_provider_of_another_host_completes_a_process_without_one():
    verdict = classify_lines(
        [
            info(ORIGIN_A, EFA_PROVIDER),
            info(ORIGIN_A, SEND_LIBFABRIC),
            info(ORIGIN_B, RECEIVE_LIBFABRIC),
        ]
    )

    assert verdict.processes == {"ip-10-0-1-23:4711": "efa", "ip-10-0-1-87:5022": "efa"}
    assert verdict.transport == "efa"
    assert verdict.evidence == [
        info(ORIGIN_A, EFA_PROVIDER),
        info(ORIGIN_A, SEND_LIBFABRIC),
        info(ORIGIN_B, RECEIVE_LIBFABRIC),
    ]


def test_own_tcp_provider_wins_over_efa_on_other_hosts():
    verdict = classify_lines(
        [
            info(ORIGIN_A, EFA_PROVIDER),
            info(ORIGIN_A, SEND_LIBFABRIC),
            info(ORIGIN_B, "NET/OFI Selected provider is tcp, fabric is 10.0.0.0/16"),
            info(ORIGIN_B, RECEIVE_LIBFABRIC),
        ]
    )

    assert verdict.transport == "socket"
    assert verdict.processes == {"ip-10-0-1-23:4711": "efa", "ip-10-0-1-87:5022": "socket"}


def test_processes_that_disagree_without_sockets_are_unknown():
    verdict = classify_lines(
        [
            info(ORIGIN_A, EFA_PROVIDER),
            info(ORIGIN_A, SEND_LIBFABRIC),
            info(ORIGIN_B, "Channel 00/0 : 3[3] -> 4[0] [receive] via NET/IB/0"),
        ]
    )

    assert verdict.transport == "unknown"
    assert "disagree" in verdict.reason


def test_local_channels_of_a_multi_node_communicator_are_not_intra_node():
    verdict = classify_lines(
        [
            info(ORIGIN_A, _comm(rank=1, nodes=2)),
            info(ORIGIN_A, "Channel 00/0 : 1[1] -> 2[2] via SHM/direct/direct"),
        ]
    )

    assert verdict.transport == "unknown"


def test_ray_prefix_without_nccl_prefix_groups_by_ray_ip_and_pid():
    coloured = "\x1b[36m(RayTrainWorker pid=1234, ip=10.0.1.23)\x1b[0m NCCL INFO " + SEND_SOCKET

    verdict = classify_lines([coloured + " [repeated 3x across cluster]"])

    assert verdict.transport == "socket"
    assert verdict.processes == {"10.0.1.23:1234": "socket"}
    assert verdict.by_host["10.0.1.23"] == [
        "(RayTrainWorker pid=1234, ip=10.0.1.23) NCCL INFO " + SEND_SOCKET
    ]


def test_line_seen_in_worker_log_and_again_in_driver_output_is_evidence_once():
    first, second = (
        info(ORIGIN_B, f"Channel {channel:02d}/0 : 3[3] -> 4[0] [receive] via NET/Socket/0")
        for channel in (0, 1)
    )

    verdict = classify_lines([first, f"(RayTrainWorker pid=5022, ip=10.0.1.87) {first}", second])

    assert verdict.evidence == [first, second]


def test_ray_prefixed_processes_without_nccl_prefix_keep_their_own_lines():
    lines = [f"(RayTrainWorker pid={pid}, ip=10.0.1.23) NCCL INFO {SEND_SOCKET}" for pid in (7, 8)]

    verdict = classify_lines(lines)

    assert verdict.evidence == lines


def test_timestamped_warn_lines_are_attributed_to_their_host():
    warn = (
        "[2026-05-11 09:14:21] ip-10-0-1-87:5022:5075 [0] int nccl_net_ofi_create_plugin("
        "nccl_net_ofi_plugin_t**):421 NCCL WARN NET/OFI aws-ofi-nccl initialization failed"
    )

    verdict = classify_lines([warn, info(ORIGIN_B, RECEIVE_SOCKET)])

    assert verdict.by_host["ip-10-0-1-87"][0] == warn


@pytest.mark.parametrize(
    ("transport", "expect", "ok"),
    [
        ("efa", None, True),
        ("socket", None, True),
        ("ib", None, True),
        ("intra-node", None, False),
        ("unknown", None, False),
        ("efa", "efa", True),
        ("socket", "efa", False),
        ("intra-node", "intra-node", True),
    ],
)
def test_ok_and_json(transport, expect, ok):
    verdict = Verdict(transport, "why", "high", ["line"], {"host": ["line"]}, {"host:1": transport})

    document = verdict.to_json(expect)

    assert verdict.ok(expect) is ok
    assert document == {
        "transport": transport,
        "ok": ok,
        "expect": expect,
        "confidence": "high",
        "reason": "why",
        "evidence": ["line"],
        "by_host": {"host": ["line"]},
        "processes": {"host:1": transport},
    }
    json.dumps(document)


@pytest.mark.parametrize(
    ("ranks", "hosts", "transport", "missing"),
    [
        (8, 2, "efa", None),
        (16, 2, "unknown", "nothing tells it for 8 of 16 ranks"),
        (8, 3, "unknown", "nothing tells it for 1 of 3 hosts"),
    ],
)
def test_a_verdict_covers_every_rank_and_host_or_is_unknown(ranks, hosts, transport, missing):
    verdict = classify_files([FIXTURES / "efa_ofi_1_20_ray_session"]).covering(ranks, hosts)

    assert verdict.transport == transport
    if missing:
        assert verdict.confidence == "none"
        assert verdict.reason.startswith(
            "the lines of only 8 NCCL processes on 2 hosts tell their transport (efa: "
        )
        assert verdict.reason.endswith(missing)
        assert verdict.evidence  # what was judged stays visible


def test_one_process_over_tcp_is_socket_however_few_processes_were_read():
    verdict = classify_lines([info(ORIGIN_B, RECEIVE_SOCKET)]).covering(8, 2)

    assert (verdict.transport, verdict.confidence) == ("socket", "high")


HOSTLESS_FIXTURES = [
    # (fixture, transport, processes): real logs whose lines carry no host name, as posted in issues
    ("ib_hostless_prefix_tf_nccl_2_4.log", "ib", {"unknown-host:5202": "ib"}),
    ("efa_no_prefix_nccl_2_9_9_p4d.log", "efa", {"unknown-host": "efa"}),
    (
        "socket_anonymised_prefix_nccl_2_18.log",
        "socket",
        {
            "unknown-host:919": "intra-node",
            "unknown-host:921": "intra-node",
            "unknown-host:923": "intra-node",
            "unknown-host:924": "intra-node",
            "unknown-host:926": "socket",
        },
    ),
]


@pytest.mark.parametrize(("fixture", "transport", "processes"), HOSTLESS_FIXTURES)
def test_cli_judges_a_log_without_host_names_with_the_default_ranks_and_hosts(fixture, transport, processes):
    """`--ranks 1 --hosts 1` (the defaults): the log's lines are its own host's, so they cover it."""
    result = _cli(str(FIXTURES / fixture))

    assert result.returncode == 0, result.stdout
    document = json.loads(result.stdout)
    assert (document["transport"], document["ok"]) == (transport, True), document["reason"]
    assert document["processes"] == processes
    assert list(document["by_host"]) == ["unknown-host"]


def test_cli_expects_efa_of_the_log_without_any_prefix():
    result = _cli(
        "--expect", "efa", "--ranks", "1", "--hosts", "1", str(FIXTURES / "efa_no_prefix_nccl_2_9_9_p4d.log")
    )

    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["confidence"] == "low"


def test_a_log_without_host_names_is_one_host_however_many_the_run_had():
    verdict = classify_files([FIXTURES / "ib_hostless_prefix_tf_nccl_2_4.log"])

    assert verdict.covering(1, 1).transport == "ib"
    short = verdict.covering(1, 2)
    assert (short.transport, short.confidence) == ("unknown", "none")
    assert short.reason.startswith(
        "the lines of only 1 NCCL processes on 1 hosts (lines without a host name count as one host) tell"
    )
    assert short.reason.endswith("nothing tells it for 1 of 2 hosts")


def _single_node_ranks(prefix: str) -> list[str]:
    """Four ranks of one communicator on one node, each over P2P to the next, behind `prefix`."""
    lines = []
    for rank in range(4):
        origin = prefix.format(pid=4000 + rank, tid=4100 + rank, dev=rank)
        lines.append(
            info(
                origin, f"comm 0x5{rank} rank {rank} nRanks 4 nNodes 1 localRanks 4 localRank {rank} MNNVL 0"
            )
        )
        lines.append(
            info(origin, f"Channel 00/0 : {rank}[{rank}] -> {(rank + 1) % 4}[{(rank + 1) % 4}] via P2P/CUMEM")
        )
    return lines


def test_cli_judges_an_anonymised_log_whose_ranks_say_nnodes_1_as_one_host(tmp_path):
    """`pod-id:num:num [0]`: neither host nor pid left, every rank on `nNodes 1`: intra-node, one host."""
    log = write_bytes(tmp_path / "pod.log", "\n".join(_single_node_ranks("pod-id:num:num [{dev}]")).encode())

    default = _cli(str(log))
    expected = _cli("--expect", "intra-node", str(log))
    two_hosts = _cli("--expect", "intra-node", "--hosts", "2", str(log))

    assert default.returncode == 1  # intra-node is no network transport: not ok without --expect
    assert json.loads(default.stdout)["transport"] == "intra-node", default.stdout
    assert expected.returncode == 0, expected.stdout
    assert two_hosts.returncode == 1
    assert json.loads(two_hosts.stdout)["reason"].endswith("nothing tells it for 1 of 2 hosts")


def test_anonymised_host_names_keep_their_processes_apart():
    """`<pod-id>:pid:tid [0]`: four processes, one host, all `nNodes 1`: they cover 4 ranks on 1 host."""
    verdict = classify_lines(_single_node_ranks("<pod-id>:{pid}:{tid} [{dev}]"))

    assert verdict.transport == "intra-node"
    assert verdict.processes == {f"unknown-host:{4000 + rank}": "intra-node" for rank in range(4)}
    assert verdict.covering(4, 1).transport == "intra-node"
    assert verdict.covering(5, 1).transport == "unknown"


def test_lines_without_a_host_name_count_for_nothing_beside_lines_that_name_hosts():
    """Cluster logs carry host names: a line without one there cannot be told from theirs."""
    named = [info(ORIGIN_A, EFA_PROVIDER), info(ORIGIN_A, SEND_LIBFABRIC)]
    hostless = info(":5022:5075 [0]", RECEIVE_LIBFABRIC)

    verdict = classify_lines([*named, hostless])

    assert verdict.processes == {"ip-10-0-1-23:4711": "efa", "unknown-host:5022": "efa"}
    assert verdict.covering(1, 1).transport == "efa"
    short = verdict.covering(2, 2)
    assert short.transport == "unknown"
    assert short.reason.startswith("the lines of only 1 NCCL processes on 1 hosts tell their transport")


# A CollNet channel line as NCCL prints it, from https://github.com/NVIDIA/nccl/issues/1219.
COLLNET_SHARP = "node:176:4360 [5] NCCL INFO CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA"


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ([COLLNET_SHARP], "CollNet channels via COLLNET/SHARP, a CollNet plugin this check does not know"),
        (
            [
                COLLNET_SHARP,
                "node:176:4360 [5] NCCL INFO Channel 00/0 : 5[5] -> 13[5] [send] via NET/IB/5/GDRDMA",
            ],
            "channels via NET/IB and CollNet channels via COLLNET/SHARP at once",
        ),
    ],
    ids=["collnet-alone", "collnet-and-ib"],
)
def test_collnet_channel_is_named_as_such(lines, why):
    verdict = classify_lines(lines)

    assert verdict.transport == "unknown"
    assert verdict.reason.endswith(why), verdict.reason
    assert "via NET/SHARP" not in verdict.reason  # what it said before: SHARP as a NET plugin
    assert COLLNET_SHARP in verdict.evidence


def test_fallback_evidence_is_the_lines_that_explain_it_not_plugin_probes():
    """NCCL probes every plugin for CollNet (`Failed to find ncclCollNetPlugin_v10 symbol.`) before
    aws-ofi-nccl says why it gave up; the evidence shows why, not the probes."""
    warn = "[2026-05-11 09:14:20] ip-10-0-1-87:5022:5075 [0] nccl_net_ofi_create_plugin:421 NCCL WARN"
    lines = [
        info(ORIGIN_B, "NET/Plugin: Loaded net plugin Libfabric (v10)"),
        info(ORIGIN_B, "NET/Plugin: Failed to find ncclCollNetPlugin_v10 symbol."),
        info(
            ORIGIN_B,
            "NET/Plugin: Failed to find ncclCollNetPlugin symbol (>= v5). ncclCollNetPlugin symbols v4 and lower "
            "are not supported.",
        ),
        info(ORIGIN_B, "NET/OFI No eligible providers were found"),
        f"{warn} NET/OFI aws-ofi-nccl initialization failed",
        f"{warn} NET/OFI Initializing plugin failed",
        info(ORIGIN_B, "NET/IB : No device found."),
        info(ORIGIN_B, "NET/Socket : Using [0]eth0:10.0.1.87<0>"),
        info(ORIGIN_B, RECEIVE_SOCKET),
        info(ORIGIN_B, SEND_SOCKET),
    ]

    verdict = classify_lines(lines)

    assert verdict.transport == "socket"
    assert verdict.evidence == [
        info(ORIGIN_B, "NET/OFI No eligible providers were found"),
        f"{warn} NET/OFI aws-ofi-nccl initialization failed",
        info(ORIGIN_B, RECEIVE_SOCKET),
        info(ORIGIN_B, SEND_SOCKET),
    ]


def test_cli_exit_0_when_expectation_holds():
    result = _cli("--expect", "efa", str(FIXTURES / "efa_ofi_1_20_ray_session"))

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["transport"], document["ok"], document["expect"]) == ("efa", True, "efa")
    assert document["evidence"]


def test_cli_exit_1_on_silent_tcp_fallback():
    result = _cli("--expect", "efa", str(FIXTURES / "tcp_fallback_plugin_init_failed.log"))

    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert (document["transport"], document["ok"]) == ("socket", False)


def test_cli_without_expect_is_ok_only_for_a_network_transport():
    network = _cli(str(FIXTURES / "forced_socket_nccl_net_socket.log"))
    local = _cli(str(FIXTURES / "single_node_p2p_shm.log"))

    assert (network.returncode, json.loads(network.stdout)["ok"]) == (0, True)
    assert (local.returncode, json.loads(local.stdout)["ok"]) == (1, False)


def test_cli_rejects_unknown_as_an_expectation():
    """A log without transport lines is `unknown`; no expectation is met by it."""
    result = _cli("--expect", "unknown", str(FIXTURES / "no_nccl_lines.log"))

    assert result.returncode == 2
    assert b"invalid choice: 'unknown'" in result.stderr


def test_cli_judges_coverage_of_ranks_and_hosts():
    session = str(FIXTURES / "efa_ofi_1_20_ray_session")

    covered = _cli("--expect", "efa", "--ranks", "8", "--hosts", "2", session)
    short = _cli("--expect", "efa", "--ranks", "16", "--hosts", "2", session)

    assert covered.returncode == 0, covered.stderr
    assert short.returncode == 1
    assert json.loads(short.stdout)["transport"] == "unknown"


def test_cli_reads_stdin():
    log = (FIXTURES / "ib_infiniband.log").read_bytes()

    result = _cli("--expect", "ib", "-", stdin=log)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["transport"] == "ib"


def test_cli_exit_2_on_unreadable_input(tmp_path):
    readable, missing = FIXTURES / "ib_infiniband.log", tmp_path / "nope.log"

    result = _cli("--expect", "efa", str(readable), str(missing))

    assert result.returncode == 2
    assert result.stdout == b""
    assert b"nope.log" in result.stderr


def test_module_needs_only_the_standard_library():
    """The Pulumi program imports it without torch or ray: -S hides every site-packages."""
    probe = "import sys; sys.path.insert(0, '.'); import workloads.nccl_transport"

    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=REPO_ROOT, capture_output=True, timeout=60
    )

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args", [(), ("--expect", "tcp", "x.log"), ("--bogus", "x.log"), ("--ranks", "0", "x.log")]
)
def test_cli_exit_2_with_usage_on_bad_arguments(args):
    result = _cli(*args)

    assert result.returncode == 2
    assert b"usage: python -m workloads.nccl_transport_cli" in result.stderr


def test_running_the_verdict_module_itself_names_the_command_and_passes_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "workloads.nccl_transport", "--expect", "efa", "x.log"],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )

    assert result.returncode == 2
    assert b"python -m workloads.nccl_transport_cli" in result.stderr
