"""The head pod's Ray dashboard as the TrainingRun provider reaches it.

- The Ray Jobs REST API of the dashboard (`GET /api/jobs/`, `/api/jobs/<id>`, `/api/jobs/<id>/logs`;
  Ray docs "Ray Jobs REST API"): job records with `submission_id`, `job_id`, `status`, `message`, and
  `metadata`, the string map `ray job submit --metadata-json` attached (Ray's `JobDetails.metadata`).
  Behind Ray's token authentication, as the RayCluster runs it (`FakeRayDashboard.token`), checked as
  Ray 2.58 checks it (ray/_private/authentication/http_token_authentication.py,
  `get_token_auth_middleware`); the head pod's environment carries the token as KubeRay sets it.
  Every pod object has a `metadata.uid`, new for each pod the API server creates, as Kubernetes does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.harness.loopback import serve_on_loopback, stop_server


@dataclass
class ScriptedJob:
    """A scripted Ray job (of the fake dashboard, or the in-process fake head): each look moves one
    status on and reveals that share of the log."""

    ray_job_id: str
    driver_log: str
    statuses: list[str]
    message: str | None = None
    looks: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    efa_traffic: dict[str, int] = field(default_factory=dict)  # counter -> what it adds on each node
    # The fixture Ray job whose NCCL lines this job's processes write to their NCCL log files
    # (`write_nccl_log_files`); None: it leaves none (a job submitted before they existed).
    nccl_lines_of: str | None = None

    def status(self) -> str:
        return self.statuses[min(self.looks, len(self.statuses) - 1)]

    def job_id(self) -> str | None:
        """Ray's job id, which exists once the job's driver registered (Ray 2.58
        dashboard/modules/job/utils.py: `job_id=driver.id if driver else None`): None while the job is
        PENDING, and for one that failed before its driver started (a runtime environment that failed)."""
        seen = self.statuses[: min(self.looks, len(self.statuses) - 1) + 1]
        return self.ray_job_id if {"RUNNING", "SUCCEEDED"} & set(seen) else None

    def logs(self) -> str:
        lines = self.driver_log.splitlines(keepends=True)
        shown = len(lines) * (min(self.looks, len(self.statuses) - 1) + 1) // len(self.statuses)
        return "".join(lines[:shown])


# The token of the fake cluster's Ray (on a cluster, the one in the Secret KubeRay creates).
RAY_TOKEN = "fake-cluster-ray-token"


@dataclass
class FakeRayDashboard:
    """The head pod's Ray Jobs REST API on 127.0.0.1 (the pod's localhost:8265 is translated here).

    Behind Ray's token authentication, as the RayCluster runs it. As Ray's middleware: the header
    `Authorization`, else `X-Ray-Authorization` (its cookie is for browsers), must be `Bearer <token>`
    (Ray 2.58 ray/_private/authentication/http_token_authentication.py, `get_token_auth_middleware`;
    the comparison is `validate_authentication_token`'s, of the whole header): none is 401, another
    403, each with Ray's plain-text body. The Jobs API is none of its public paths
    (dashboard/http_server_head.py, `public_exact_paths`)."""

    jobs: dict[str, ScriptedJob] = field(default_factory=dict)
    token: str = RAY_TOKEN

    def start(self) -> FakeRayDashboard:
        self.server = serve_on_loopback({"GET": self._serve})
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def stop(self) -> None:
        stop_server(self.server)

    def _record(self, submission_id: str, job: ScriptedJob) -> dict:
        status = job.status()
        return {
            "type": "SUBMISSION",
            "submission_id": submission_id,
            "job_id": job.job_id(),
            "status": status,
            "message": job.message if status == "FAILED" else None,
            "metadata": job.metadata,
            "entrypoint": "python -m training",
        }

    def _refusal(self, handler: BaseHTTPRequestHandler) -> tuple[int, str] | None:
        header = handler.headers.get("Authorization") or handler.headers.get("X-Ray-Authorization")
        if not header:
            return 401, "Unauthorized: Missing authentication token"
        if header != f"Bearer {self.token}":
            return 403, "Forbidden: Invalid authentication token"
        return None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        refusal = self._refusal(handler)
        if refusal is not None:
            text = refusal[1].encode()
            handler.send_response(refusal[0])
            handler.send_header("Content-Type", "text/plain; charset=utf-8")
            handler.send_header("Content-Length", str(len(text)))
            handler.end_headers()
            handler.wfile.write(text)
            return
        parts = handler.path.strip("/").split("/")
        body: Any
        if parts == ["api", "jobs"]:
            body = [self._record(sid, job) for sid, job in self.jobs.items()]
        elif len(parts) in (3, 4) and parts[:2] == ["api", "jobs"] and parts[2] in self.jobs:
            job = self.jobs[parts[2]]
            if len(parts) == 3:
                body = self._record(parts[2], job)
            else:
                body = {"logs": job.logs()}
                job.looks += 1  # one poll = the job record, then its logs
        else:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = json.dumps(body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
