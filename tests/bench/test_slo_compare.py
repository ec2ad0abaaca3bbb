"""bench/slo_compare.py: goodput and P99 over accepted requests from a hand-made timeline; its repositories."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import grpc
import numpy as np
import pytest

from wok.config import load_model_config

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("slo_compare", ROOT / "bench" / "slo_compare.py")
slo_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slo_compare)

OK = 0
REFUSED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
EXPIRED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


def test_goodput_and_p99_over_accepted_requests():
    # 2 s of warm-up, then a 2 s window. In the warm-up: one fast OK (not counted). In the window:
    # 100 requests: 60 OK at 10 ms, 10 OK at 80 ms (late), 20 refused, 9 expired at 50 ms, 1 OK at
    # 500 ms. Sent 1 ms after their intended time.
    rel = np.concatenate([[0.5], 2.0 + np.arange(100) * 0.02])
    lat = np.concatenate([[0.01], [0.01] * 60, [0.08] * 10, [0.002] * 20, [0.05] * 9, [0.5]])
    codes = np.array([OK] + [OK] * 70 + [REFUSED] * 20 + [EXPIRED] * 9 + [OK], dtype=np.int16)
    done = rel + lat
    sent = rel + 0.001
    args = argparse.Namespace(warmup=2.0, duration=2.0, slo_ms=50.0)
    s = slo_compare.summarize((rel, done, lat, codes), sent, args)
    assert (s["requests"], s["ok"], s["good"], s["refused"], s["deadline_exceeded"]) == (100, 71, 60, 20, 9)
    assert s["goodput_qps"] == pytest.approx(30.0)  # 60 within 50 ms over 2 s
    assert s["accepted"] == 80
    # Accepted latencies, sorted: 60 × 10, 9 × 50, 10 × 80, 1 × 500 ms; P99 is the ⌈0.99·80⌉ = 80th: 500.
    assert s["accepted_latency_ms"]["p99"] == pytest.approx(500.0)
    assert s["accepted_latency_ms"]["p50"] == pytest.approx(10.0)
    assert s["accepted_from_send_ms"]["p99"] == pytest.approx(499.0)
    assert s["ok_latency_ms"]["p99"] == pytest.approx(500.0)
    assert s["accepted_within_slo"] == pytest.approx(60 / 80)
    tl = s["timeline"]
    assert tl["offered"] == [1, 0, 50, 50] and sum(tl["refused"]) == 20
    assert sum(tl["good"]) == 61 and sum(tl["late_or_failed"]) == 20  # 10 late, 9 expired, 1 slow


def test_the_repositories_it_writes_load_with_their_policy(tmp_path):
    fixed = slo_compare.write_repository(tmp_path / "fixed", 256, 2.0, slo_compare.FIXED)
    cfg = load_model_config(fixed / "mlp")
    assert cfg.factory == "wok.models.mlp:MLP" and cfg.parameters["hidden"] == 1024 and cfg.max_batch_size == 256
    assert cfg.dynamic_batching.policy == "fixed" and cfg.dynamic_batching.max_queue_delay_ms == 2.0
    slo = slo_compare.write_repository(tmp_path / "slo", 256, 0, slo_compare.slo_batching(35, 0.99, "p.json"))
    (slo / "mlp" / "p.json").write_text(
        json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": 5e-4, "beta_s": 3e-5}})
    )
    db = load_model_config(slo / "mlp").dynamic_batching
    assert (db.policy, db.slo_ms, db.slo_quantile, db.slo_profile) == ("slo", 35, 0.99, slo / "mlp" / "p.json")


def test_bad_options_exit_with_usage():
    with pytest.raises(SystemExit):
        slo_compare.parse_args(["--slo", "soon"])
    with pytest.raises(SystemExit):
        slo_compare.parse_args(["--rows", "0"])
    args = slo_compare.parse_args(["--fixed", "4,2ms", "--server-slo", "35ms"])
    assert args.fixed == (4, 2.0) and args.server_slo_ms == 35.0 and args.slo_ms == 50.0


def test_replot_without_plot_checks_the_plot_next_to_the_run_before_drawing(tmp_path, monkeypatch, capsys):
    """Without --plot the drawing goes next to the --replot file: an output that cannot be written
    there is refused as any bad option is (exit 2, naming it), not found by the drawing."""
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"schema": slo_compare.SCHEMA, "runs": [], "config": {}}))
    drawn = []
    monkeypatch.setattr(slo_compare, "plot", lambda doc, path: drawn.append(path))
    (tmp_path / "run.png").mkdir()  # where the drawing would go: a folder (root writes anywhere else)
    with pytest.raises(SystemExit) as exc:
        slo_compare.main(["--replot", str(run)])
    assert exc.value.code == 2 and drawn == []
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--replot {run}: plot {tmp_path / 'run.png'}: is a folder; expected a file name" in err
    (tmp_path / "run.png").rmdir()
    assert slo_compare.main(["--replot", str(run)]) == 0
    # Drawn beside run.png, then renamed over it (outputs.replacing).
    (where,) = drawn
    assert where.parent == tmp_path and where.name.startswith(".run.png.") and where.suffix == ".png"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".png"] == ["run.png"]


@pytest.mark.parametrize("given", [None, "the run"], ids=["derived", "given"])
def test_replot_refuses_to_draw_over_its_own_run(given, tmp_path, monkeypatch, capsys):
    """The plot's path was the run's with .png for a suffix: a run saved as *.png (or --plot naming
    the run) was drawn over, its only copy lost."""
    run = tmp_path / "run.png"
    text = json.dumps({"schema": slo_compare.SCHEMA, "runs": [], "config": {}})
    run.write_text(text)
    drawn = []
    monkeypatch.setattr(slo_compare, "plot", lambda doc, path: drawn.append(path))
    argv = ["--replot", str(run)]
    if given:
        (tmp_path / "link.png").symlink_to(run)  # another name of the same file
        argv += ["--plot", str(tmp_path / "link.png")]
    with pytest.raises(SystemExit) as exc:
        slo_compare.main(argv)
    assert exc.value.code == 2 and drawn == [] and run.read_text() == text
    err = capsys.readouterr().err.strip().splitlines()[-1]
    if given:
        want = (
            f"--plot {tmp_path / 'link.png'}: is --replot's run, which drawing would overwrite; expected another path"
        )
    else:
        want = f"--replot {run}: plot {run}: is the run itself, which drawing would overwrite; give --plot to "
        want += "draw it elsewhere"
    assert err.endswith(f"error: {want}"), err


def test_replot_whose_drawing_fails_says_so_and_keeps_the_run(tmp_path, monkeypatch, capsys):
    """The drawing ran unguarded: an error in it (matplotlib's, a full disk) ended --replot in a
    traceback. It is --plot's error now (exit 1, as at the end of a run); the run stays in its file."""
    run = tmp_path / "run.json"
    text = json.dumps({"schema": slo_compare.SCHEMA, "runs": [], "config": {}})
    run.write_text(text)

    def plot(doc, path):
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(slo_compare, "plot", plot)
    assert slo_compare.main(["--replot", str(run)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and run.read_text() == text
    last = err.strip().splitlines()[-1]
    assert last.endswith(f"--plot {tmp_path / 'run.png'}: RuntimeError: cannot draw; the run is unchanged in {run}"), (
        last
    )


def test_the_tuning_simulates_the_step_the_run_sends(monkeypatch):
    """The fixed window was tuned on a step of warm-up + (warm-up + window), 24 s for the
    defaults' 22 s run: the burst's t0 = 50% and sigma = 10% fell at 12 s and 2.4 s there,
    at 11 s and 2.2 s in the run it was compared in."""
    from wok.bench import tune as tune_mod
    from wok.bench.arrivals import parse_arrivals

    seen = []
    monkeypatch.setattr(tune_mod, "profile_from_document", lambda doc, what: tune_mod.Profile(1e-3, 1e-4))
    monkeypatch.setattr(tune_mod, "tune", lambda profile, search, *a, **k: seen.append(search) or {})
    args = argparse.Namespace(
        rows=16, warmup=2.0, duration=20.0, arrival="burst:amplitude=5x,t0=50%,sigma=10%", slo_ms=50.0, seed=0,
        request_sizes=[1, 2], delays_ms=[0.0, 1.0],
    )  # fmt: skip
    slo_compare.tune_fixed({}, args)
    (search,) = seen
    assert (search.warmup_s, search.duration_s) == (args.warmup, args.duration)
    simulated = parse_arrivals(search.arrival, 150.0, duration_s=search.warmup_s + search.duration_s)
    sent = parse_arrivals(args.arrival, 150.0, duration_s=args.warmup + args.duration)  # as Ramp.run_step parses it
    assert simulated == sent
