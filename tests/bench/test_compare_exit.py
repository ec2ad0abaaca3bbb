"""bench/compare.py with a server that exits during its ramp: the run is kept with its `error`,
left out of the summary, and the harness exits 1. Real servers on loopback (the bare transport,
the quickest to start), the kill gated on the ramp's own progress line."""

from __future__ import annotations

import json

from wok.bench import compare


def test_a_run_whose_server_exited_mid_ramp_is_left_out_of_the_summary(tmp_path, monkeypatch, capsys):
    """The steps after the exit fail, which the ramp's stop rule reads as overload: the ramp was
    not cut (`interrupted` null), the run had no error, and its max QPS counted; exit 0."""
    real = compare.metered_ramp
    killed = []

    def metered_ramp(server, cfg, progress, processes=None):
        def said(line: str) -> None:
            progress(line)
            # Once its first step is done: step 2 then finds it gone.
            if line.startswith("step 1/3: achieved") and not killed:
                killed.append(server.proc.pid)
                server.proc.kill()
                server.proc.wait()

        return real(server, cfg, said, processes)

    monkeypatch.setattr(compare, "metered_ramp", metered_ramp)
    out = tmp_path / "c.json"
    argv = ["--servers", "bare", "--steps", "20,40,80", "--step-duration", "0.25s", "--warmup", "0.05s",
            "--reps", "1", "--workers", "1", "--host-probe", "0", "--json", str(out)]  # fmt: skip
    # A slow step on a loaded machine must not end a ramp by its P99: only the failed step may.
    argv += ["--stop-factor", "1e9"]
    try:
        status = compare.main(argv)
    finally:
        compare.stop_all()
    err = capsys.readouterr().err
    assert killed, "the server was never killed"
    doc = json.loads(out.read_text())
    (gone,) = doc["runs"]
    assert gone["error"] is not None, err[-2000:]
    assert gone["error"].startswith("interrupted: the server exited with -9 during the ramp; see "), gone["error"]
    assert gone["error"].endswith("/bare.log")  # the server's log, in the harness's own folder
    # The ramp itself was not cut: the failed step ended it by the stop rule, its steps kept.
    assert "ramp ended early" not in err and "stopping early: no request of the step succeeded (" in err
    assert len(gone["steps"]) == 2 and gone["steps"][1]["success_rate"] == 0.0  # no third step
    assert "bare left out of the summary: interrupted: the server exited with -9" in err
    summary = doc["summary"]["bare"]
    assert summary["runs"] == 0
    assert summary["max_qps_p99_200ms"]["median"] is None  # not 20 QPS, where the server died
    assert status == 1


def test_every_ramp_of_a_run_runs_on_the_same_load_generator_processes(tmp_path, monkeypatch, capsys):
    """Each ramp started its --workers processes afresh, a spawned interpreter's imports each (0.25-0.7 s a ramp):
    the run's ramps share one WorkerProcesses, its workers kept from one ramp to the next and stopped at the end."""
    real = compare.metered_ramp
    seen = []

    def metered_ramp(server, cfg, progress, processes=None):
        result = real(server, cfg, progress) if processes is None else real(server, cfg, progress, processes)
        seen.append((processes, [p.pid for p in processes._procs] if processes is not None else None))
        return result

    monkeypatch.setattr(compare, "metered_ramp", metered_ramp)
    argv = ["--servers", "bare", "--steps", "20", "--step-duration", "0.25s", "--warmup", "0.05s",
            "--reps", "2", "--workers", "2", "--host-probe", "0", "--stop-factor", "1e9"]  # fmt: skip
    try:
        status = compare.main(argv)
    finally:
        compare.stop_all()
    assert status == 0, capsys.readouterr().err[-2000:]
    (first, pids), (second, again) = seen
    assert first is second and first is not None
    assert len(pids) == 2 and again == pids
    assert not len(first)  # stopped with the run
