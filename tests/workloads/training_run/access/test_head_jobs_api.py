"""`workloads/training_run/access/head_jobs_api.py`, the program the TrainingRun runs in the head pod:
its answers from the Jobs REST API of a fake dashboard, and its one-line refusal without the cluster's
Ray token (with a real head: test_jobs.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.harness.fake_ray_dashboard import RAY_TOKEN, FakeRayDashboard, ScriptedJob
from tests.harness.ray_head import token_auth_env
from tests.harness.training_run_fakes import EFA_JOB
from workloads.training_run.access import head_jobs_api, jobs
from workloads.training_run.access.commands import LocalExecutor
from workloads.training_run.errors import TrainingRunError

# The pods a job's metadata records (`jobs.PODS_METADATA`): pod name = its UID.
PODS = "head=u1 worker-a=u2"


def test_the_head_program_answers_from_the_jobs_rest_api():
    dashboard = FakeRayDashboard().start()
    try:
        dashboard.jobs["eks-ray-train-main-1"] = ScriptedJob(
            EFA_JOB, "line 1\nline 2\n", ["RUNNING", "SUCCEEDED"], metadata={jobs.PODS_METADATA: PODS}
        )
        listed = head_jobs_api.answer(dashboard.url, "list", "eks-ray-train-main", token=dashboard.token)
        assert listed == {
            "jobs": [
                {
                    "submission_id": "eks-ray-train-main-1",
                    "job_id": EFA_JOB,
                    "status": "RUNNING",
                    "message": None,
                    "metadata": {jobs.PODS_METADATA: PODS},
                }
            ]
        }
        first = head_jobs_api.answer(dashboard.url, "poll", "eks-ray-train-main-1", 0, dashboard.token)
        assert (first["job"]["status"], first["logs"], first["offset"]) == ("RUNNING", "line 1\n", 7)
        second = head_jobs_api.answer(dashboard.url, "poll", "eks-ray-train-main-1", 7, dashboard.token)
        assert (second["job"]["status"], second["logs"]) == ("SUCCEEDED", "line 2\n")
        assert head_jobs_api.answer(dashboard.url, "poll", "other", 0, dashboard.token) == {
            "job": None,
            "logs": "",
            "offset": 0,
        }
    finally:
        dashboard.stop()


def head_container_env(**auth: str) -> dict[str, str]:
    """This machine's environment with only the given Ray auth variables, as a Ray container has them."""
    outside = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH_")}
    return {**outside, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **auth}


@pytest.mark.parametrize(
    "auth, said",
    [
        ({}, "refused GET /api/jobs/ without a token (401: Unauthorized: Missing authentication token)"),
        (
            {head_jobs_api.TOKEN_ENV: "another-token"},
            "refused the token in RAY_AUTH_TOKEN for GET /api/jobs/ (403: Forbidden: Invalid authentication token)",
        ),
    ],
    ids=["no-token", "another-token"],
)
def test_the_head_program_without_the_clusters_token_stops_in_one_line_naming_it(auth, said):
    """`head_jobs_api` run as the TrainingRun runs it in the head pod (`python -c`), with the Ray
    container's environment: with the cluster's token it lists; without it Ray's dashboard refuses."""
    dashboard = FakeRayDashboard().start()
    try:
        kuberay_env = head_container_env(**token_auth_env(RAY_TOKEN))
        assert jobs.RayJobsClient(LocalExecutor(env=kuberay_env), dashboard.url).list("eks-ray-train") == []
        client = jobs.RayJobsClient(LocalExecutor(env=head_container_env(**auth)), dashboard.url)
        with pytest.raises(TrainingRunError) as caught:
            client.list("eks-ray-train")
        first, line = str(caught.value).splitlines()
        assert first == "listing Ray jobs failed (exit 1):"
        assert said in line
    finally:
        dashboard.stop()
