"""bench/chaos.py: a short chaos run against a real server on a loopback port passes its audit,
and the audit finds each broken rule in a doctored copy of that run."""

from __future__ import annotations

import copy
import logging
import re
import socket

import pytest
from prometheus_client import generate_latest

from wok.bench import chaos
from wok.executor import NOT_RERUN


def _first(run: chaos.Run, channel: str, kind: str, code: str) -> chaos.Req:
    return next(
        r for r in run.reqs.values() if (r.channel, r.kind, [a[0] for a in r.answers]) == (channel, kind, [code])
    )


def _with_sample(text: str, series: str, change) -> str:
    """`text` with the value of the exposition line starting with `series` replaced by change(value)."""
    pattern = re.compile(rf"^({re.escape(series)}) (\S+)$", re.M)
    assert pattern.search(text), series
    return pattern.sub(lambda m: f"{m.group(1)} {change(float(m.group(2)))}", text)


async def test_a_chaos_run_gets_one_right_answer_per_request_and_the_servers_counts_agree(serve, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    root = chaos.write_repository(tmp_path / "repo")
    async with serve(models=(), repository=root) as server:
        plan = chaos.Plan(seconds=6.0, rate=150.0, streams=2, bad_burst=0.01, seed=11)
        run = await chaos.drive(f"127.0.0.1:{server.port}", plan)
        text = generate_latest(server.metrics.registry).decode()
    doc = chaos.result(run, chaos.audit(run, text))
    assert doc["problems"] == [], chaos.table(doc)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # The load reached every path: each kind its own code, bad values found by the reruns,
    # the client's cancels and deadlines, V2 timeouts both met and passed, streams.
    codes = doc["codes"]
    assert codes["unary/good"]["OK"] > 300 and codes["stream/good"]["OK"] > 50
    assert codes["final/good"] == {"OK": 50}
    assert codes["unary/bad"]["INTERNAL"] > 20 and doc["bad_alone"] > 10
    for kind in ("bad_shape", "bad_dtype", "unparsed"):
        assert codes[f"unary/{kind}"].get("INVALID_ARGUMENT", 0) > 0, kind
    assert codes["unary/unknown"]["NOT_FOUND"] > 0 and codes["stream/unknown"].get("NOT_FOUND", 0) > 0
    assert codes["unary/good"].get("CANCELLED", 0) + codes["unary/bad"].get("CANCELLED", 0) > 0
    # Requests whose only deadline is their V2 timeout (not a stream's deadline too): both outcomes.
    streams = {st.id: st for st in run.streams}
    timed = [
        r.answers[0][0]
        for r in run.reqs.values()
        if r.kind == "good" and r.timeout_us and r.answers and not (r.stream and streams[r.stream].timeout_s)
    ]
    assert timed.count("OK") > 0 and timed.count("DEADLINE_EXCEEDED") > 0, timed
    # The server counted cut calls as such: no client-side rule can tell a cut call counted under
    # another code (it may have been answered first).
    assert doc["server"].get("chaos/CANCELLED", 0) > 0
    assert any(st.cancelled for st in run.streams) and doc["streams"] > 10
    assert doc["server"]["chaos/OK"] == doc["model_stats"]["success"] > 0
    not_errors = ("chaos/OK", "chaos/CANCELLED", "chaos/DEADLINE_EXCEEDED")
    assert doc["server"]["chaos/INVALID_ARGUMENT"] + doc["server"]["chaos/INTERNAL"] <= doc["model_stats"]["fail"]

    # The audit is no rubber stamp: each doctored copy breaks one rule.
    def problems(doctor, metrics: str = text) -> list[str]:
        bent = copy.deepcopy(run)
        doctor(bent)
        return chaos.audit(bent, metrics)["problems"]

    def answer(channel, kind, code, *new):
        def doctor(bent):
            r = _first(bent, channel, kind, code)
            r.answers[0] = new or ("OK", "", r.expected())

        return doctor

    def each(*found):
        return lambda got: all(any(f in p for p in got) for f in found)

    def twice(bent):
        r = _first(bent, "stream", "good", "OK")
        r.answers.append(r.answers[0])

    def lost(bent):
        st = next(st for st in bent.streams if st.status == "OK" and st.id != "final")
        r = bent.reqs[st.serials[-1]]
        r.answers.clear()
        r.sent = False  # as when a server ends a stream OK while the client still writes

    def too_soon(bent):
        r = next(r for r in bent.reqs.values() if r.channel == "unary" and r.timeout_us and r.answers[0][0] == "OK")
        r.answers[0] = ("DEADLINE_EXCEEDED", "request to model 'chaos' waited 0.1 ms in the queue ...", None)
        r.answered_at = r.sent_at + r.timeout_us / 2e6

    def stray(bent):
        bent.streams[0].stray_ids.append("123456789")

    def broken_stream(bent):
        st = next(st for st in bent.streams if st.status == "OK" and st.id != "final")
        st.status, st.details = "INTERNAL", "the server ended it"

    def stats(bent):
        bent.model_stats["success"] += 1

    errors = sum(n for key, n in doc["server"].items() if key.startswith("chaos/") and key not in not_errors)

    def fail_short(bent):  # an error answered and not in fail (as when only the batcher's counted)
        bent.model_stats["fail"] = errors - 1

    def fail_over(bent):  # more failures than errors answered (as when every gRPC deadline counted)
        bent.model_stats["fail"] = errors + doc["server"]["chaos/DEADLINE_EXCEEDED"] + 1

    def ended_early(bent):
        st = next(st for st in bent.streams if st.status == "OK" and st.id != "final")
        st.writer_error = "InvalidStateError('RPC already finished.')"

    cases = {
        "wrong rows": (answer("unary", "good", "OK", "OK", "", [[0.0, 0.0]]), each("expected rows [[")),
        "unreadable": (
            answer("unary", "good", "OK", "OK", "", "an answer that cannot be read: KeyError('y')"),
            each("got an answer that cannot be read: KeyError"),
        ),
        "twice": (twice, each("expected one answer; got 2")),
        "lost": (lost, each("expected an answer; got none")),
        "bad answered": (answer("unary", "bad", "INTERNAL"), each("expected INTERNAL; got OK")),
        "not cut": (answer("unary", "good", "OK", "CANCELLED", "cancelled", None), each("the client cut nothing")),
        "no deadline": (
            answer("unary", "bad_shape", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "x", None),
            each("DEADLINE_EXCEEDED without a deadline"),
        ),
        "early timeout": (too_soon, each("before its timeout")),
        "unmarked": (
            answer("unary", "good", "OK", "INTERNAL", "model 'chaos' failed: IndexError", None),
            each("good request", "expected OK; got INTERNAL"),
        ),
        "final": (answer("final", "good", "OK", "UNAVAILABLE", "gone", None), each("after the load")),
        "stray": (stray, each("ids of no request of its own")),
        "stream": (broken_stream, each("ended INTERNAL: the server ended it")),
        "stats": (stats, each("ModelStatistics success grew by")),
        "fail short": (fail_short, each("ModelStatistics fail grew by")),
        "fail over": (fail_over, each("ModelStatistics fail grew by")),
        "ended early": (ended_early, each("ended OK before the client had written all")),
        # A hang is the client's verdict: no count of the server's can hold it.
        "hung": (
            answer("unary", "good", "OK", "HUNG", "no answer in 60 s", None),
            lambda got: any("hung" in p for p in got) and not any("wok_responses_total{" in p for p in got),
        ),
    }
    for name, (doctor, found) in cases.items():
        got = problems(doctor)
        assert found(got), (name, got)
    # A marked one is the documented probing case: counted, no problem of its own (the server's
    # counts, left as they were, no longer add up).
    bent = copy.deepcopy(run)
    answer("unary", "good", "OK", "INTERNAL", f"model 'chaos' failed: IndexError {NOT_RERUN}", None)(bent)
    checked = chaos.audit(bent, text)
    assert checked["undecided_good"] == doc["undecided_good"] + 1
    assert all(p.startswith("wok_responses_total") for p in checked["problems"]), checked["problems"]

    # One OK more than the client saw from the server and could not place.
    over = _with_sample(text, 'wok_responses_total{code="OK",model="chaos"}', lambda v: v + doc["unplaced"] + 1)
    assert each("wok_responses_total{model='chaos',code='OK'}", "wok_responses_total grew by")(
        problems(lambda bent: None, over)
    )
    # The calls that ended in grpc.aio before wok's handler ran count with the codes' in the total:
    # one counted there and under a code too (or twice) passes what the client could not place.
    ended = 'wok_calls_ended_before_handler_total{method="ModelInfer"}'
    both = _with_sample(text, ended, lambda v: v + doc["unplaced"] + 1)
    got = problems(lambda bent: None, both)
    responses = sum(doc["server"].values())
    assert len(got) == 1 and got[0].startswith(f"wok_responses_total grew by {responses} and {ended[:36]} by "), got
    assert isinstance(doc["ended_before_handler"], int) and doc["ended_before_handler"] >= 0
    assert f" by {doc['ended_before_handler'] + doc['unplaced'] + 1}, " in got[0], got
    # ... as its growth over the run: what it held before is taken off.
    checked = chaos.audit(run, both, f"{ended} {doc['unplaced'] + 1}\n")
    assert (checked["ended_before_handler"], checked["problems"]) == (doc["ended_before_handler"], [])
    left = _with_sample(text, 'wok_queue_depth{model="chaos"}', lambda v: v + 1)
    assert each("wok_queue_depth is 1")(problems(lambda bent: None, left))
    # Counts from before the run are taken off: the same text before and after is a run of none.
    assert each("grew by 0; the client saw")(chaos.audit(run, text, text)["problems"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "127.0.0.1"], "--target '127.0.0.1': expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name"),
        (["--target", "dns:///wok:8001"], "--target 'dns:///wok:8001': a gRPC name; give its --metrics-url"),
    ],
)
def test_a_target_chaos_cannot_reach_as_given_is_refused_before_the_run(argv, message, capsys):
    """A target without a port went to gRPC as given (it dials 443) and to the metrics URL made from it."""
    with pytest.raises(SystemExit) as exc:
        chaos.main(["--seconds", "1", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: {message}\n")


def test_a_refusal_and_the_usage_name_the_command_as_it_is_run(capsys):
    """Without a prog, argparse named the script by its file ("chaos.py"), and its own lines began "wok chaos:",
    a command there is none of; all name `python -m wok.bench.chaos`, as docs/reliability.md runs it."""
    with pytest.raises(SystemExit) as exc:
        chaos.main(["--seconds", "soon"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m wok.bench.chaos [-h]"), err
    assert err.endswith("\npython -m wok.bench.chaos: error: argument --seconds: expected a number; got 'soon'\n"), err


def test_a_server_whose_metrics_cannot_be_read_is_one_line_not_a_traceback(capsys):
    """The audit compares the server's counters before and after: without them, nothing is run."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}/metrics"
        assert chaos.main(["--seconds", "1", "--target", f"127.0.0.1:{port}", "--metrics-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m wok.bench.chaos: cannot read the server's metrics at {url}: "), err
    assert err.count("\n") == 1, err


def test_a_metrics_url_urllib_cannot_take_is_one_line_too(capsys):
    assert chaos.main(["--seconds", "1", "--target", "127.0.0.1:1", "--metrics-url", "notaurl"]) == 1
    err = capsys.readouterr().err
    said = "python -m wok.bench.chaos: cannot read the server's metrics at notaurl: unknown url type"
    assert err.startswith(said), err
    assert err.count("\n") == 1, err


def test_a_server_gone_during_the_load_is_one_line_not_a_traceback(monkeypatch, capsys):
    """The counts read after the load (ModelStatistics, /metrics) from a server that died meanwhile."""
    import grpc

    def gone(target, plan, progress=None):
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Connection refused"
        )

    monkeypatch.setattr(chaos, "_scrape", lambda url: "")
    monkeypatch.setattr(chaos, "drive", lambda *a, **k: gone(*a, **k))
    argv = ["--seconds", "1", "--target", "127.0.0.1:1", "--metrics-url", "http://127.0.0.1:1/metrics"]
    assert chaos.main(argv) == 1
    err = capsys.readouterr().err
    said = "python -m wok.bench.chaos: cannot read the server's counts after the load: UNAVAILABLE: Connection refused"
    assert err == said + "\n"
