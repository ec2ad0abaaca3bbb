"""bench/unhandled_cost.py: a short run writes every variant's figure and counts no call that reached its handler."""

from __future__ import annotations

import json
import math

from wok.bench import unhandled_cost


def test_a_short_run_writes_every_variant_and_pair(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert unhandled_cost.main(["--calls", "50", "--reps", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "wok.unhandled_cost/1"
    assert (report["calls"], report["reps"], report["reference_us"]) == (50, 3, 410.0)
    medians = report["median_us_per_call"]
    assert set(medians) == {"none", "counter", "done_callback", "token", "token_counter"}
    assert all(math.isfinite(v) and v > 0 for v in medians.values()), medians
    assert [(p["variant"], p["baseline"]) for p in report["pairs"]] == list(unhandled_cost.PAIRS)
    for p in report["pairs"]:
        assert p["added_us"] == medians[p["variant"]] - medians[p["baseline"]]
        assert p["of_reference"] == p["added_us"] / 410.0
        assert math.isfinite(p["median_ratio"]) and p["median_ratio"] > 0
    assert "token_counter" in capsys.readouterr().out


def test_counts_below_one_are_refused(capsys):
    for option in ("--calls", "--reps"):
        try:
            unhandled_cost.main([option, "0"])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"{option} 0 was taken")
        assert f"{option}: expected an integer >= 1; got 0" in capsys.readouterr().err
