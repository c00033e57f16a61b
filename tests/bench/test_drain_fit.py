"""The drain benchmark's scenarios at the cluster's sizes, run 50 times faster: 9 GiB a node through four
S3 streams commits inside the grace the preview sets, with a write in flight and without; the replaced
path, fsynced to one gp3 volume at 125 MiB/s before the upload, misses a 110 s drain either way."""

from __future__ import annotations

import json

import pytest

from bench.drain_fit import GIB, MIB, main, run_scenario, scenarios
from training.config.drain_budget import STREAM_BYTES_PER_S

# Some 8 s each, in real seconds; the arithmetic they run is tests/training/config/test_drain_budget.py's.
pytestmark = pytest.mark.slow


def test_the_direct_path_fits_its_grace_and_the_staged_one_misses_110_s():
    outcomes = {
        (scenario.path, scenario.in_flight): run_scenario(scenario, time_scale=50.0)
        for scenario in scenarios(9 * GIB, 4, STREAM_BYTES_PER_S, 125 * MIB, 5.0, None)
    }
    assert outcomes[("direct", False)].fits and outcomes[("direct", False)].committed_step == "drain"
    assert outcomes[("direct", True)].fits and outcomes[("direct", True)].committed_step == "in flight"
    for in_flight in (False, True):
        staged = outcomes[("staged", in_flight)]
        assert staged.deadline_s == 110 and not staged.fits
        assert staged.committed_at_s is not None and staged.committed_at_s > 110


def test_a_grace_too_short_for_any_write_commits_nothing_and_the_report_keeps_its_command(tmp_path):
    out = tmp_path / "drain-fit.json"
    main(["--out", str(out), "--grace", "30", "--time-scale", "50"])
    report = json.loads(out.read_text())
    assert report["command"].endswith(f"-m bench.drain_fit --out {out} --grace 30 --time-scale 50")
    direct = [result for result in report["results"] if result["scenario"]["path"] == "direct"]
    assert [result["choice"] for result in direct] == ["nothing can commit", "nothing can commit"]
    assert not any(result["fits"] for result in direct)
