"""The job's metrics to CloudWatch: requests botocore accepts and moto's CloudWatch serves back, batched
off the training thread; nothing without the cluster's name or with --local; a failing or hung
endpoint costs one warning and never a step."""

from __future__ import annotations

import datetime
import json
import threading

import boto3
import botocore.config
import botocore.session
import pytest
from moto import mock_aws

from tests.harness.paths import REPO_ROOT
from training.config.run_config import parse_flags
from training.metrics import cloudwatch_sink
from training.metrics.cloudwatch_metrics import (
    BUSBW_METRIC,
    CLUSTER_NAME_ENV,
    EFA_METRIC,
    LOST_STEPS_METRIC,
    METRICS,
    NAMESPACE,
    RESTARTS_METRIC,
)
from training.metrics.cloudwatch_sink import CloudWatchSink, publish_busbw, publish_step, step_datums
from training.metrics.report import StepMetrics

REGION = "us-east-2"
CLUSTER = "eks-ray-train"
ENVIRON = {CLUSTER_NAME_ENV: CLUSTER, "AWS_REGION": REGION}
HOSTS = ("ray-train-gpu-workers-worker-4kq9z", "ray-train-gpu-workers-worker-v8m2t")
# The probe's JSON line as the gate's driver printed it on a cluster (tests/fixtures/training_run/README.md).
PROBE_REPORT = json.loads(
    (REPO_ROOT / "tests/fixtures/training_run/driver_probe.log").read_text().strip().splitlines()[-1]
)


def record(step: int, steps: int = 3, **overrides) -> StepMetrics:
    values = {
        "step": step,
        "steps": steps,
        "loss": 5.0 - step,
        "lr": 3e-3,
        "grad_norm": 0.75,
        "eval_loss": None,
        "eval_perplexity": None,
        "step_time_s": 0.5,
        "tokens_per_s": 1000.0 * step,
        "tokens_per_s_per_gpu": 125.0 * step,
        "mfu": 0.25,
        "peak_mem_gib": 3.25,
        "efa_bytes_per_s": {HOSTS[0]: 2.0e9, HOSTS[1]: None},
    }
    values.update(overrides)
    return StepMetrics(**values)


@pytest.fixture
def cloudwatch(monkeypatch):
    """moto's CloudWatch, reached by botocore's real client (which validates each request against
    the service model before sending it)."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    with mock_aws():
        yield boto3.client("cloudwatch", region_name=REGION)


def counting(client):
    """The client, and the PutMetricData requests it sent (botocore's own event, after validation)."""
    sent: list[dict] = []
    client.meta.events.register(
        "before-call.cloudwatch.PutMetricData", lambda params, **_: sent.append(params)
    )
    return client, sent


def values_of(client, name: str, dimensions: dict[str, str], stat: str = "Maximum") -> list[float]:
    """One statistic over every point of the last minutes: moto's GetMetricData counts its periods
    from StartTime, so one period of an hour holds them all, wherever the minute boundaries fall."""
    now = datetime.datetime.now(datetime.UTC)
    answer = client.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NAMESPACE,
                        "MetricName": name,
                        "Dimensions": [{"Name": key, "Value": value} for key, value in dimensions.items()],
                    },
                    "Period": 3600,
                    "Stat": stat,
                },
            }
        ],
        StartTime=now - datetime.timedelta(minutes=5),
        EndTime=now + datetime.timedelta(minutes=5),
    )
    return answer["MetricDataResults"][0]["Values"]


def test_a_run_goes_out_in_one_request_and_cloudwatch_serves_it_back(cloudwatch, capsys):
    client, sent = counting(cloudwatch)
    config = parse_flags(["--run-name", "job-1", "--steps", "3"])
    for step in (1, 2, 3):
        publish_step(config, record(step), environ=ENVIRON, client_factory=lambda: client)
    assert len(sent) == 1  # three steps batched; the last one sent them
    run = {"ClusterName": CLUSTER, "RunName": "job-1"}
    assert values_of(cloudwatch, "tokens_per_s", run) == [3000.0]
    assert values_of(cloudwatch, "loss", run, "Minimum") == [2.0]
    assert values_of(cloudwatch, "mfu", run) == [0.25]
    assert values_of(cloudwatch, "step_time_s", run, "SampleCount") == [3.0]
    assert values_of(cloudwatch, EFA_METRIC, {**run, "Host": HOSTS[0]}) == [2.0e9]
    # A node whose counters were unknown that step sends no point rather than a made-up one.
    assert values_of(cloudwatch, EFA_METRIC, {**run, "Host": HOSTS[1]}) == []
    assert capsys.readouterr().err == ""


def test_every_data_point_has_a_unit_of_cloudwatchs_model_and_its_declared_dimensions():
    units = botocore.session.get_session().get_service_model("cloudwatch").shape_for("StandardUnit").enum
    assert {unit for unit, _ in METRICS.values()} <= set(units)
    assert not NAMESPACE.startswith("AWS/")
    at = datetime.datetime.now(datetime.UTC)
    datums = [
        *step_datums(record(1), CLUSTER, "job-1", at),
        *cloudwatch_sink.busbw_datums(PROBE_REPORT, CLUSTER, at),
    ]
    for datum in datums:
        unit, dimensions = METRICS[datum["MetricName"]]
        assert datum["Unit"] == unit
        assert tuple(d["Name"] for d in datum["Dimensions"]) == dimensions


def test_values_cloudwatch_cannot_hold_are_left_out():
    at = datetime.datetime.now(datetime.UTC)
    names = [d["MetricName"] for d in step_datums(record(1, loss=float("nan"), mfu=None), CLUSTER, "r", at)]
    assert names == ["tokens_per_s", "step_time_s", EFA_METRIC]


def test_the_gates_busbw_is_each_collectives_at_its_largest_size(cloudwatch, capsys):
    client, sent = counting(cloudwatch)
    publish_busbw(PROBE_REPORT, environ=ENVIRON, client_factory=lambda: client)
    assert len(sent) == 1
    largest = {
        collective: max(
            (r for r in PROBE_REPORT["results"] if r["collective"] == collective), key=lambda r: r["bytes"]
        )
        for collective in ("all_reduce", "all_gather", "reduce_scatter")
    }
    for collective, row in largest.items():
        dimensions = {"ClusterName": CLUSTER, "Collective": collective}
        assert values_of(cloudwatch, BUSBW_METRIC, dimensions) == [row["busbw_gbps"]]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--run-name", "job-1"], {"AWS_REGION": REGION}),  # a stack with observability off
        (["--run-name", "job-1", "--local"], ENVIRON),  # a laptop that happens to have the variable
    ],
)
def test_without_the_cluster_name_or_with_local_nothing_is_published_or_said(argv, environ, capsys):
    def no_client():
        raise AssertionError("a client was made")

    threads = threading.active_count()
    config = parse_flags([*argv, "--steps", "2"])
    for step in (1, 2):
        publish_step(config, record(step, steps=2), environ=environ, client_factory=no_client)
    publish_busbw(PROBE_REPORT, environ=environ if "--local" not in argv else {}, client_factory=no_client)
    assert threading.active_count() == threads
    assert capsys.readouterr() == ("", "")


def test_a_pod_without_credentials_gets_one_warning_and_every_step(monkeypatch, tmp_path):
    """What a pod without its IRSA role meets: botocore finds no credentials (environment, files and
    the instance metadata all ruled out), on every request."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    warnings: list[str] = []
    sink = CloudWatchSink(lambda: cloudwatch_sink.cloudwatch_client(REGION), warn=warnings.append)
    at = datetime.datetime.now(datetime.UTC)
    # More points than one request holds: three requests, each refused.
    for step in range(1, 601):
        sink.put(step_datums(record(step, steps=600), CLUSTER, "job-1", at))
    sink.close()
    assert len(warnings) == 1
    assert "NoCredentialsError" in warnings[0] and "training goes on" in warnings[0]
    assert sink.requests == 0


def test_an_unreachable_endpoint_is_one_warning_for_the_whole_run(capsys):
    """Every request refused at connect (nothing listens on the port): one line on stderr."""
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago, now closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def unreachable():
        return boto3.client(
            "cloudwatch",
            region_name=REGION,
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="AKIAEXAMPLE",
            aws_secret_access_key="secret",
            config=botocore.config.Config(retries={"max_attempts": 1}, connect_timeout=1),
        )

    config = parse_flags(["--run-name", "job-2", "--steps", "4"])
    for step in (1, 2, 3, 4):
        publish_step(config, record(step, steps=4), environ=ENVIRON, client_factory=unreachable)
    publish_busbw(PROBE_REPORT, environ=ENVIRON, client_factory=unreachable)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2  # one for the run, one for the gate's own sink
    assert all("EndpointConnectionError" in line and "training goes on" in line for line in lines)


def test_a_hung_request_never_holds_a_step(cloudwatch):
    """A request in flight that does not come back (botocore blocked on the network) stands for
    the endpoint here: steps keep handing points over while it hangs."""
    entered, release = threading.Event(), threading.Event()

    class Hung:
        def put_metric_data(self, **request):
            entered.set()
            release.wait()
            return cloudwatch.put_metric_data(**request)

    sink = CloudWatchSink(Hung, flush_seconds=3600)
    at = datetime.datetime.now(datetime.UTC)
    step = 0
    while not entered.is_set():  # enough points to wake the thread into its first request
        step += 1
        sink.put(step_datums(record(step, steps=10_000), CLUSTER, "job-3", at))
    for more in range(step + 1, step + 300):  # all handed over while the request hangs
        sink.put(step_datums(record(more, steps=10_000), CLUSTER, "job-3", at))
    assert not release.is_set()
    release.set()
    sink.close()
    assert sink.requests >= 2


def test_a_restart_goes_out_with_the_steps_as_one_restart_and_its_lost_steps(cloudwatch):
    """The restarted rank 0 publishes once after its first step, before that step's points; the
    run's last step sends both (training/loop.py)."""
    client, sent = counting(cloudwatch)
    config = parse_flags(["--run-name", "job-2", "--steps", "3"])
    cloudwatch_sink.publish_restart(config, 4, environ=ENVIRON, client_factory=lambda: client)
    publish_step(config, record(3), environ=ENVIRON, client_factory=lambda: client)
    assert len(sent) == 1
    run = {"ClusterName": CLUSTER, "RunName": "job-2"}
    assert values_of(cloudwatch, RESTARTS_METRIC, run, "Sum") == [1.0]
    assert values_of(cloudwatch, LOST_STEPS_METRIC, run, "Sum") == [4.0]
    at = datetime.datetime.now(datetime.UTC)
    for datum in cloudwatch_sink.restart_datums(4, CLUSTER, "job-2", at):
        unit, dimensions = METRICS[datum["MetricName"]]
        assert (datum["Unit"], tuple(d["Name"] for d in datum["Dimensions"])) == (unit, dimensions)
