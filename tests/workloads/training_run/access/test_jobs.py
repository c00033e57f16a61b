"""Jobs: the submission id, which earlier attempt is adopted, the `ray job submit` command line, and a
real head with token authentication taking jobs only with its token (the head pod's Jobs API program
alone: test_head_jobs_api.py)."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request

import pytest

from tests.harness.ray_head import running_head
from tests.harness.training_run_fakes import SMOKE_ARGS, run_inputs
from workloads.training_run import runner
from workloads.training_run.access import head_jobs_api, jobs
from workloads.training_run.access.commands import LocalExecutor
from workloads.training_run.errors import TrainingRunError


def test_submission_id_is_stable_and_follows_what_the_job_runs():
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    assert base == jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    assert base.startswith("eks-ray-train-main-")
    assert base == jobs.submission_id_base(
        run_inputs(expect_transport="socket", timeout_minutes=5).job_identity(), "main", {}
    )
    others = {
        jobs.submission_id_base(run_inputs(code_hash="1" * 16).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(job_args=("--steps", "9")).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(cluster_name="b").job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(run_spec_hash="2" * 16).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(gpu_instance_type="g6.48xlarge").job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs().job_identity(), "tcp", runner.TCP_BASELINE_ENV),
        jobs.submission_id_base(
            run_inputs().job_identity(), "tcp", {**runner.TCP_BASELINE_ENV, "NCCL_SOCKET_NTHREADS": "8"}
        ),
    }
    assert base not in others and len(others) == 7


PODS_NOW, OTHER_PODS = "head=u1 worker-a=u2", "head=u1 worker-a=u3"


@pytest.mark.parametrize(
    "existing, expected, adopted",
    [
        ([], "B", None),
        ([("B", "RUNNING", OTHER_PODS)], "B", "RUNNING"),
        ([("B", "PENDING", None)], "B", "PENDING"),
        ([("B", "SUCCEEDED", PODS_NOW)], "B", "SUCCEEDED"),
        ([("B", "SUCCEEDED", OTHER_PODS)], "B-2", None),
        ([("B", "SUCCEEDED", None)], "B-2", None),
        ([("B", "FAILED", PODS_NOW)], "B-2", None),
        ([("B", "FAILED", None), ("B-2", "STOPPED", None)], "B-3", None),
        ([("B", "SUCCEEDED", None), ("B-2", "FAILED", None), ("B-10", "RUNNING", None)], "B-10", "RUNNING"),
        ([("B", "SUCCEEDED", PODS_NOW), ("B-2", "SUCCEEDED", OTHER_PODS)], "B-3", None),
        ([("B-other", "RUNNING", None), ("BB", "RUNNING", None)], "B", None),
    ],
)
def test_plan_submission_adopts_live_jobs_judges_done_ones_again_only_on_their_pods(
    existing, expected, adopted
):
    records = [
        jobs.JobRecord(sid, jobs.JobStatus(status), metadata={jobs.PODS_METADATA: pods} if pods else {})
        for sid, status, pods in existing
    ]
    plan = jobs.choose_submission(records, "B", PODS_NOW)
    assert plan.submission_id == expected
    assert (plan.adopted.status if plan.adopted else None) == adopted
    if existing and existing[-1][1] == "SUCCEEDED":
        assert plan.note and existing[-1][0] in plan.note


def test_submit_command_ships_the_code_and_names_the_run_after_the_job():
    argv = jobs.submit_command(
        jobs.DASHBOARD_ADDRESS, "job-1", "/opt/eks-ray-train", SMOKE_ARGS, runner.TCP_BASELINE_ENV, PODS_NOW
    )
    assert json.loads(argv[argv.index("--metadata-json") + 1]) == {jobs.PODS_METADATA: PODS_NOW}
    assert argv[argv.index("--runtime-env-json") + 1].count("NCCL_DEBUG_FILE") == 1
    assert argv[:5] == ["ray", "job", "submit", "--address", "http://localhost:8265"]
    assert argv[argv.index("--working-dir") + 1] == "/opt/eks-ray-train"
    assert "--no-wait" in argv and argv[argv.index("--submission-id") + 1] == "job-1"
    entrypoint = argv[argv.index("--") + 1 :]
    assert entrypoint == ["python", "-m", "training", *SMOKE_ARGS, "--run-name", "job-1"]
    env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
    assert env["NCCL_DEBUG_FILE"] == "/tmp/ray/nccl-job-1.%h.%p.log"  # NCCL: %h host, %p pid
    assert env["NCCL_NET"] == "Socket" and env["NCCL_NET_PLUGIN"] == "none"
    assert int(env["NCCL_SOCKET_NTHREADS"]) * int(env["NCCL_NSOCKS_PERTHREAD"]) > 1
    plain = jobs.submit_command(jobs.DASHBOARD_ADDRESS, "j", "/c", SMOKE_ARGS, {}, PODS_NOW)
    assert json.loads(plain[plain.index("--runtime-env-json") + 1]) == {
        "env_vars": {
            "NCCL_DEBUG_FILE": "/tmp/ray/nccl-j.%h.%p.log",
            "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "1200",
        }
    }


def test_a_restarted_worker_group_waits_as_long_as_a_node_replacement_takes():
    """Ray Train gives a worker group RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S to start, 60 s by default
    (ray/train/v2/_internal/constants.py): no replaced GPU node is back by then. The job's runtime
    environment sets it to the replacement's bound, under the name Ray reads, and passes it on to Ray
    Train's controller (ENV_VARS_TO_PROPAGATE)."""
    from ray.train.v2._internal import constants

    from infra.aws_rules.node_repair import NODE_REPLACEMENT_S

    assert jobs.WORKER_GROUP_START_TIMEOUT_ENV == constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR
    assert jobs.WORKER_GROUP_START_TIMEOUT_ENV in constants.ENV_VARS_TO_PROPAGATE
    assert NODE_REPLACEMENT_S > constants.DEFAULT_WORKER_GROUP_START_TIMEOUT_S
    for env_vars in ({}, runner.TCP_BASELINE_ENV):
        argv = jobs.submit_command(jobs.DASHBOARD_ADDRESS, "j", "/c", SMOKE_ARGS, env_vars, PODS_NOW)
        env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
        assert float(env[jobs.WORKER_GROUP_START_TIMEOUT_ENV]) == NODE_REPLACEMENT_S


def test_job_status_mirrors_rays():
    from ray.job_submission import JobStatus as RayJobStatus

    assert {status.value for status in jobs.JobStatus} == {status.value for status in RayJobStatus}
    for status in RayJobStatus:
        assert jobs.JobStatus(status.value).is_terminal == status.is_terminal()


@pytest.mark.slow
def test_a_ray_head_with_token_authentication_takes_jobs_only_with_its_token(tmp_path):
    """A real `ray start --head` with RAY_AUTH_MODE=token, as KubeRay starts the RayCluster's head:
    the Jobs API refuses requests without the token (401) or with another (403); the TrainingRun's
    own client, `ray job submit` and `head_jobs_api` run with the head's environment, submits, lists
    and follows a job whose driver and task reach Ray's GCS with the token they inherit."""
    token = base64.b64encode(os.urandom(32)).decode()  # as KubeRay's generateRandomToken(32)
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello_job.py").write_text(
        "import ray\n\nray.init()\nprint(ray.get(ray.remote(lambda: 'hello from a task').remote()))\n"
    )
    with running_head(token=token) as head:
        submit = json.dumps({"entrypoint": "echo never"}).encode()
        for headers, status in (({}, 401), ({"Authorization": "Bearer another-token"}, 403)):
            for method, body in (("GET", None), ("POST", submit)):
                request = urllib.request.Request(
                    f"{head.dashboard}/api/jobs/", data=body, method=method, headers=headers
                )
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=10)
                assert refused.value.code == status, (method, headers)

        client = jobs.RayJobsClient(LocalExecutor(env=head.env), head.dashboard, str(head.root))
        client.submit("eks-ray-train-auth-1", str(code), (), {}, PODS_NOW, module="hello_job")
        logs, deadline = "", time.monotonic() + 120
        while True:
            poll = client.poll("eks-ray-train-auth-1", len(logs))
            logs += poll.logs
            assert poll.job is not None
            if poll.job.status.is_terminal or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert poll.job.status == jobs.JobStatus.SUCCEEDED, logs
        assert "hello from a task" in logs
        assert [job.submission_id for job in client.list("eks-ray-train-auth")] == ["eks-ray-train-auth-1"]
        assert client.list("eks-ray-train-auth")[0].pods == PODS_NOW

        without = {key: value for key, value in head.env.items() if key != head_jobs_api.TOKEN_ENV}
        with pytest.raises(TrainingRunError, match=r"without a token \(401: Unauthorized"):
            jobs.RayJobsClient(LocalExecutor(env=without), head.dashboard).list("eks-ray-train-auth")
