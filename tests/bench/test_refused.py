"""Requests the server refuses: its message reaches the operator, and a ramp of malformed requests
fails (exit 2) instead of passing as a server that answered nothing."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np

from wok.bench import analysis, report
from wok.bench.workers import Outcome, Share, _run_share, merge_details

# The encoder's positions stop at 256: every request of 257 tokens is refused. (A --rows above the
# model's max_batch_size is refused before the ramp, from its config: tests/bench/test_soak_checks.py.)
TOO_LONG = "input 'tokens': expected a sequence length of at most 256; got 257"
INVALID, NOT_FOUND, UNAVAILABLE = (c.value[0] for c in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                                                        grpc.StatusCode.UNAVAILABLE))  # fmt: skip


def _ramp(target: str, out, *extra: str) -> list[str]:
    argv = ["bench", "ramp", "--target", target, "--steps", "20,40", "--step-duration", "0.5s", "--warmup", "0.1s"]
    return [*argv, "--workers", "1", "--metrics-url", "none", "--json", str(out), *extra]


def test_a_step_refused_as_malformed_ends_the_ramp_with_exit_2_and_the_servers_message(bench_server, tmp_path, wok_cli):
    """Every request INVALID_ARGUMENT. The ramp exited 0,
    ran its higher steps, and said only "0.0% ok" and an error count, never the server's words. Its hint names the
    values it sent (a refusal of ids past a table names the table's rows, not the ramp's --int-high)."""
    out = tmp_path / "r.json"
    status, stdout, err = wok_cli(*_ramp(bench_server.target, out, "--model", "encoder", "--sizes", "fixed:257"))
    assert status == 2, err
    result = json.loads(out.read_text())
    (step,) = result["steps"]  # stopped after the first step
    n = step["errors"]["INVALID_ARGUMENT"]
    # The file said nothing of the stop: `interrupted` (a signal's or an error's cut) stayed null.
    why = "the server refused every request of the step (INVALID_ARGUMENT)"
    assert (result["interrupted"], result["stopped_early"]) == (
        None,
        {"reason": why, "rule": "refused_as_bad", "at_qps": step["offered_qps"], "steps_run": 1, "steps_planned": 2},
    )
    assert f"stopping early: {why}\n" in err
    assert (step["ok"], step["errors"], step["error_details"]) == (
        0,
        {"INVALID_ARGUMENT": n},
        {"INVALID_ARGUMENT": TOO_LONG},
    )
    assert f"step 1/2: {n} × INVALID_ARGUMENT: {TOO_LONG}\n" in err
    assert f"\nerrors: {n} × INVALID_ARGUMENT: {TOO_LONG}\n" in stdout
    assert err.endswith(
        f"wok bench: the server refused every request at 20 QPS as a bad request (INVALID_ARGUMENT: {TOO_LONG}); "
        "check --model, --rows (1), --sizes ('fixed:257') and --int-high (not given: 50, or an input's id bound the "
        "server publishes) against the model\n"
    )


def test_a_stream_ramp_shows_the_servers_message_as_a_unary_one_does(bench_server, tmp_path, wok_cli):
    """`--rpc stream` recorded no message: the step said "INVALID_ARGUMENT" and a count, not why."""
    out = tmp_path / "r.json"
    argv = _ramp(
        bench_server.target, out, "--model", "encoder", "--sizes", "fixed:257", "--rpc", "stream", "--streams", "1"
    )
    status, stdout, err = wok_cli(*argv)
    assert status == 2, err
    (step,) = json.loads(out.read_text())["steps"]
    n = step["errors"]["INVALID_ARGUMENT"]
    assert (step["ok"], step["error_details"]) == (0, {"INVALID_ARGUMENT": TOO_LONG})
    assert f"step 1/2: {n} × INVALID_ARGUMENT: {TOO_LONG}\n" in err
    assert f"\nerrors: {n} × INVALID_ARGUMENT: {TOO_LONG}\n" in stdout


def test_some_requests_refused_show_the_message_and_do_not_fail_the_run(bench_server, tmp_path, wok_cli):
    """recsys's table holds 20000 rows here: one id drawn below 25000 is past it one time in five."""
    out = tmp_path / "r.json"
    argv = _ramp(bench_server.target, out, "--model", "recsys", "--sizes", "fixed:1", "--int-high", "25000")
    status, _, err = wok_cli(*argv, "--stop-factor", "inf")
    assert status == 0, err
    steps = json.loads(out.read_text())["steps"]
    assert len(steps) == 2 and all(s["ok"] for s in steps)
    refused = [s for s in steps if s["errors"]]
    assert refused, "no id drawn past the table in either step"
    for s in refused:
        assert list(s["error_details"]) == ["INVALID_ARGUMENT"]
        assert s["error_details"]["INVALID_ARGUMENT"].startswith("input 'ids': expected ids in [0, 20000)")


class _Refusing:
    """A unary call that fails with the code and message its payload names."""

    def __init__(self, answers: dict[bytes, tuple[grpc.StatusCode, str]]) -> None:
        self.answers = answers

    def __call__(self, payload: bytes, timeout=None, metadata=None):
        async def call():
            code, message = self.answers[payload]
            if code != grpc.StatusCode.OK:
                raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=message)

        return call()


async def test_a_worker_keeps_the_first_message_of_each_code():
    pool = [b"ok", b"bad-a", b"bad-b", b"gone", b"boom"]
    call = _Refusing(
        {
            b"ok": (grpc.StatusCode.OK, ""),
            b"bad-a": (grpc.StatusCode.INVALID_ARGUMENT, "first\n  message"),
            b"bad-b": (grpc.StatusCode.INVALID_ARGUMENT, "second message"),
            b"gone": (grpc.StatusCode.NOT_FOUND, "x" * 500),
            b"boom": (grpc.StatusCode.UNAVAILABLE, ""),
        }
    )
    which = np.array([0, 1, 2, 3, 4, 1])
    share = Share(time.monotonic(), np.arange(len(which)) * 1e-3, which, 5.0)
    outcome = await _run_share(call, pool, share)
    assert outcome.codes.tolist() == [0, INVALID, INVALID, NOT_FOUND, UNAVAILABLE, INVALID]
    assert outcome.details == {INVALID: "first message", NOT_FOUND: "x" * 299 + "…", UNAVAILABLE: ""}


def test_the_coordinator_keeps_one_message_per_code_the_first_workers():
    def outcome(details):
        empty = np.empty(0)
        return Outcome(empty, empty, empty.astype(np.int16), np.empty((0, 2)), details=details)

    merged = merge_details([outcome({INVALID: "a"}), outcome({INVALID: "b", NOT_FOUND: "c"}), outcome({})])
    assert merged == {INVALID: "a", NOT_FOUND: "c"}


def _step(codes: list[str], details: dict[str, str] | None) -> dict:
    n = len(codes)
    done = np.arange(n, dtype=float) * 0.01
    return analysis.step_result(
        offered_qps=n,
        duration_s=1.0,
        intended_s=done,
        sent_s=done,
        done_s=done,
        codes=np.array(codes),
        error_details=details,
    )


def test_a_step_is_refused_as_malformed_only_when_every_request_got_a_bad_request_code():
    details = {"INVALID_ARGUMENT": "too many rows", "NOT_FOUND": "no such model", "UNAVAILABLE": "warm-up only"}
    step = _step(["INVALID_ARGUMENT", "NOT_FOUND"], details)
    # Only the codes the step counts: the one seen in the warm-up alone is left out.
    assert step["error_details"] == {"INVALID_ARGUMENT": "too many rows", "NOT_FOUND": "no such model"}
    assert analysis.refused_as_bad(step) == "INVALID_ARGUMENT: too many rows; NOT_FOUND: no such model"
    assert analysis.refused_as_bad(_step(["INVALID_ARGUMENT"], {})) == "INVALID_ARGUMENT"
    assert analysis.refused_as_bad(_step(["INVALID_ARGUMENT", "OK"], details)) is None
    assert analysis.refused_as_bad(_step(["INVALID_ARGUMENT", "UNAVAILABLE"], details)) is None
    assert analysis.refused_as_bad(_step(["UNAVAILABLE"], details)) is None
    # wok simulate's steps have no messages, and no key for them.
    assert "error_details" not in _step(["RESOURCE_EXHAUSTED"], None)


def test_a_step_with_no_request_ok_names_each_code_with_its_count_whatever_the_codes():
    # What ends a ramp even with --stop-factor inf (a test against a real server: tests/bench/test_faults.py).
    step = _step(["INTERNAL", "UNAVAILABLE", "INTERNAL"], {"INTERNAL": "boom"})
    assert analysis.none_ok(step) == "2 × INTERNAL, 1 × UNAVAILABLE"
    assert analysis.none_ok(_step(["UNAVAILABLE"], None)) == "1 × UNAVAILABLE"
    # Failed by load: the server measured past its capacity, which --stop-factor inf runs on through.
    assert analysis.none_ok(_step(["DEADLINE_EXCEEDED"], None)) is None
    assert analysis.none_ok(_step(["RESOURCE_EXHAUSTED", "UNAVAILABLE"], None)) is None
    assert analysis.none_ok(_step(["INTERNAL", "OK"], {})) is None
    assert analysis.none_ok(_step([], {})) is None  # no request: stop_rule's own case


def test_the_table_prints_each_codes_message_under_it(capsys):
    steps = [_step(["OK", "INVALID_ARGUMENT"], {"INVALID_ARGUMENT": "too many rows"}), _step(["INVALID_ARGUMENT"], {})]
    report.print_table({"steps": steps, "slo_p99_ms": 200.0, "max_qps_under_slo": None, "knee_qps": None})
    assert capsys.readouterr().out.endswith("\nerrors: 2 × INVALID_ARGUMENT: too many rows\n")


def test_a_step_the_model_failed_on_every_request_fails_the_ramp_naming_int_high(capsys):
    """A torch.export model with a 10-row nn.Embedding, ramped with the default --int-high 50: every request
    came back INTERNAL (IndexError), and the ramp exited 0 with a knee 'at or below 20 QPS', a capacity verdict
    on a model that never ran."""
    import argparse

    from wok.bench.cli import BAD_REQUESTS, _exit_status

    detail = "model 'tok' failed: IndexError: index out of range in self"
    step = _step(["INTERNAL"] * 3, {"INTERNAL": detail})
    args = argparse.Namespace(soak=None, require_qps=None, int_high=50)
    assert _exit_status({"steps": [step], "max_qps_under_slo": None}, args) == BAD_REQUESTS
    assert capsys.readouterr().err == (
        f"wok bench: the model failed every request at 3 QPS (INTERNAL: {detail}); not a capacity result: check "
        "the model, and --int-high (50; default 50, or an input's id bound the server publishes) against its "
        "embedding tables\n"
    )
    assert analysis.failed_by_model(step) == f"INTERNAL: {detail}"
    # One request answered, or one refused for load: the server ran the model, so the step is measured.
    assert analysis.failed_by_model(_step(["INTERNAL", "OK"], {"INTERNAL": detail})) is None
    assert analysis.failed_by_model(_step(["INTERNAL", "UNAVAILABLE"], {"INTERNAL": detail})) is None


def test_a_step_a_fail_fault_failed_on_every_request_is_measured_not_a_broken_model(capsys):
    """A fault run whose `fail:` fault spans a whole step fails every request of it INTERNAL ("failing by fault
    injection"): what the fault is for; it exited 2, blaming --int-high, and hid the fault's own status."""
    import argparse

    from wok.bench.cli import _exit_status

    step = _step(["INTERNAL"] * 3, {"INTERNAL": "model 'mlp' instance 0: failing by fault injection"})
    faults = {
        "faults": [{"fault": "fail:model=mlp,at=20%,until=60%", "kind": "fail", "start_s": 1.0, "end_s": 3.0}],
        "events": [],
    }
    args = argparse.Namespace(soak=None, require_qps=None, int_high=50)
    result = {"steps": [step], "max_qps_under_slo": None, "faults": faults}
    assert _exit_status(result, args) == 0
    assert capsys.readouterr().err == ""
