"""The Ray Jobs REST API as JSON, run in the head pod: `python -c <this file> ADDRESS list PREFIX`.

Shipped as source through the exec channel and run with the image's Python, so it uses the
standard library only. It prints one JSON line: `ray job status/logs` print text meant for people.
The REST paths are those of Ray's Jobs API (https://docs.ray.io/en/latest/cluster/running-applications/job-submission/api.html):
`GET /api/jobs/` lists jobs, `GET /api/jobs/<submission id>` one job, `.../logs` its driver log.

- `list PREFIX`: `{"jobs": [record, ...]}` of the jobs whose submission id starts with PREFIX;
- `poll SUBMISSION_ID OFFSET`: `{"job": record or null, "logs": new log text, "offset": n}`.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

RECORD_KEYS = ("submission_id", "job_id", "status", "message", "metadata")
TIMEOUT_S = 60


def _get(address: str, path: str):
    try:
        with urllib.request.urlopen(address.rstrip("/") + path, timeout=TIMEOUT_S) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def _record(job: dict) -> dict:
    return {key: job.get(key) for key in RECORD_KEYS}


def answer(address: str, action: str, subject: str, offset: int = 0) -> dict:
    if action == "list":
        jobs = _get(address, "/api/jobs/") or []
        return {
            "jobs": [_record(job) for job in jobs if (job.get("submission_id") or "").startswith(subject)]
        }
    job = _get(address, "/api/jobs/" + subject)
    logs = ((_get(address, "/api/jobs/" + subject + "/logs") or {}).get("logs") or "") if job else ""
    return {"job": job and _record(job), "logs": logs[offset:], "offset": len(logs)}


def main(argv: list[str]) -> None:
    address, action, subject = argv[:3]
    print(json.dumps(answer(address, action, subject, int(argv[3]) if len(argv) > 3 else 0)))


if __name__ == "__main__":
    main(sys.argv[1:])
