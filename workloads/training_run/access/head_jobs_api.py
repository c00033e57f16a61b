"""The Ray Jobs REST API as JSON, run in the head pod: `python -c <this file> ADDRESS list PREFIX`.

Shipped as source through the exec channel and run with the image's Python, so it uses the
standard library only. It prints one JSON line: `ray job status/logs` print text meant for people.
The REST paths are those of Ray's Jobs API (https://docs.ray.io/en/latest/cluster/running-applications/job-submission/api.html):
`GET /api/jobs/` lists jobs, `GET /api/jobs/<submission id>` one job, `.../logs` its driver log.

- `list PREFIX`: `{"jobs": [record, ...]}` of the jobs whose submission id starts with PREFIX;
- `poll SUBMISSION_ID OFFSET`: `{"job": record or null, "logs": new log text, "offset": n}`.

Ray's token authentication: each request carries `Authorization: Bearer <RAY_AUTH_TOKEN>`, the
token KubeRay puts in the head's Ray container (the RayCluster's `authOptions`). Ray's dashboard
takes that header and compares the token, trimmed of whitespace as Ray trims it, with its own
(Ray 2.58 ray/_private/authentication/http_token_authentication.py, `get_token_auth_middleware`;
authentication_constants.py: `authorization`, `Bearer `); it answers 401 to a request without a
token and 403 to another token, which end this program with one line on stderr. Without
RAY_AUTH_TOKEN no header is sent, as to a Ray without token authentication.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

RECORD_KEYS = ("submission_id", "job_id", "status", "message", "metadata")
TIMEOUT_S = 60
# The token's variable, the first place Ray looks for it (src/ray/rpc/authentication/authentication_token_loader.cc).
TOKEN_ENV = "RAY_AUTH_TOKEN"


def _refusal(address: str, path: str, error: urllib.error.HTTPError) -> str:
    said = f"{error.code}: {' '.join(error.read().decode(errors='replace').split())}"
    if error.code == 401:
        return (
            f"the Ray dashboard at {address} refused GET {path} without a token ({said}): Ray's token "
            f"authentication is on; run this where {TOKEN_ENV} holds the cluster's token, as KubeRay sets it "
            "in the head pod's Ray container"
        )
    return (
        f"the Ray dashboard at {address} refused the token in {TOKEN_ENV} for GET {path} ({said}): set it to "
        "the token the head's Ray started with, the one in the Secret KubeRay named after the RayCluster"
    )


def _get(address: str, path: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(address.rstrip("/") + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        if error.code in (401, 403):
            raise SystemExit(_refusal(address, path, error)) from None
        raise


def _record(job: dict) -> dict:
    return {key: job.get(key) for key in RECORD_KEYS}


def answer(address: str, action: str, subject: str, offset: int = 0, token: str | None = None) -> dict:
    if action == "list":
        jobs = _get(address, "/api/jobs/", token) or []
        return {
            "jobs": [_record(job) for job in jobs if (job.get("submission_id") or "").startswith(subject)]
        }
    job = _get(address, "/api/jobs/" + subject, token)
    logs = ((_get(address, "/api/jobs/" + subject + "/logs", token) or {}).get("logs") or "") if job else ""
    return {"job": job and _record(job), "logs": logs[offset:], "offset": len(logs)}


def main(argv: list[str]) -> None:
    address, action, subject = argv[:3]
    token = os.environ.get(TOKEN_ENV, "").strip() or None
    print(json.dumps(answer(address, action, subject, int(argv[3]) if len(argv) > 3 else 0, token)))


if __name__ == "__main__":
    main(sys.argv[1:])
