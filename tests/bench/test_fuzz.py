"""wok.bench.fuzz's judge of a server's answer, and its long names, without a server.

The fuzzer first drew names of at most 6 characters and counted any RESOURCE_EXHAUSTED as a
clear answer, so it could not see a long name echoed in an error's details reach the client as
RESOURCE_EXHAUSTED "received metadata size exceeds hard limit" (fixed in commit f115e6c). The
run against a server is tests/integration/test_fuzz_server.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, given, settings

from wok.bench import fuzz
from wok.codec import encode_request
from wok.service import short_details

SERVABLES = {"alltypes": fuzz.all_types_servable()}
CFG = SERVABLES["alltypes"].config
# What the old server's client got for a long name: gRPC's own status, not the server's.
HEADER_LIMIT = "Stream removed (received metadata size exceeds hard limit (value length 40015 vs. 16384))"


def _request(**fields) -> fuzz.pb.ModelInferRequest:
    req = encode_request("alltypes", {"in_fp32": fuzz.np.ones((1, 2), fuzz.np.float32)})
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def _judge(req_or_bytes, code: str, details: str = "", **kwargs):
    payload = req_or_bytes if isinstance(req_or_bytes, bytes) else req_or_bytes.SerializeToString()
    return fuzz.judge(payload, code, details, SERVABLES, **kwargs)


def test_resource_exhausted_for_a_small_request_is_unclear_unless_it_is_a_refusal_of_the_server():
    req = _request(model_name="m" * 40_000)
    key, why = _judge(req, "RESOURCE_EXHAUSTED", HEADER_LIMIT)
    assert key == "RESOURCE_EXHAUSTED under the size limits" and "metadata size exceeds" in why, why
    # Over the size limit, it is the right answer.
    assert _judge(req, "RESOURCE_EXHAUSTED", "Received message larger than max", max_request_bytes=1024) is None
    # wok's own refusals, whatever the request's size.
    full = "model 'alltypes' queue is full: 4 requests queued, max_queue_size is 4; retry later"
    assert _judge(_request(), "RESOURCE_EXHAUSTED", full) is None
    assert _judge(_request(), "RESOURCE_EXHAUSTED", "the deadline cannot be met; retry after 3 ms") is None


@pytest.mark.parametrize("code", ["UNKNOWN", "INTERNAL", "UNAVAILABLE", "CANCELLED"])
def test_a_status_that_is_not_clear_is_unclear(code):
    assert _judge(_request(), code, "boom") == (f"status {code}", f"status {code}: 'boom'")


@pytest.mark.parametrize("unit", ["m", "\u00e9", "\x00"], ids=["ascii", "utf-8", "control"])
def test_details_over_4_kib_as_sent_are_unclear_and_the_servers_cut_ones_are_clear(unit):
    name = unit * 9_000
    details = f"unknown model '{name}'; this server serves: alltypes"
    req = _request(model_name=name)
    key, why = _judge(req, "NOT_FOUND", details)
    assert key == "details too long" and f"{fuzz.sent_size(details):,} bytes as sent" in why, why
    cut = short_details(details)
    assert fuzz.sent_size(cut) <= fuzz.DETAILS_BYTES
    assert _judge(req, "NOT_FOUND", cut) is None


def test_sent_size_counts_bytes_as_the_grpc_message_header_carries_them():
    assert fuzz.sent_size("abc ~") == 5
    assert fuzz.sent_size("%") == 3  # '%' itself is escaped
    assert fuzz.sent_size("\x00\n\x7f") == 9
    assert fuzz.sent_size("\u00e9") == 6 and fuzz.sent_size("\U0001f600") == 12


@pytest.mark.parametrize(
    ("version", "want"),
    [
        ("", None),
        ("1", None),
        ("01", None),  # Triton reads the version as an integer: version 1
        ("0", "NOT_FOUND"),
        ("02", "NOT_FOUND"),
        (str(2**63 - 1), "NOT_FOUND"),
        ("abc", "INVALID_ARGUMENT"),
        ("-1", "INVALID_ARGUMENT"),
        ("1.0", "INVALID_ARGUMENT"),
        ("+1", "INVALID_ARGUMENT"),
        ("\u0661", "INVALID_ARGUMENT"),  # a digit, but not an ASCII one
        (str(2**63), "INVALID_ARGUMENT"),  # past int64, as Triton's std::stol refuses it
        ("1" * 5000, "INVALID_ARGUMENT"),
    ],
)
def test_a_model_version_is_expected_to_be_read_as_triton_reads_it(version, want):
    got = fuzz.wrong_name(_request(model_version=version), SERVABLES)
    assert got == (None if want is None else (want, "model version", version))


def test_a_version_that_is_no_integer_is_expected_refused_before_an_unknown_model_name():
    # Triton reads the version first, whatever the name; an integer version leaves the name to be refused.
    for version in ("-1", "9" * 20):
        got = fuzz.wrong_name(_request(model_name="nope", model_version=version), SERVABLES)
        assert got == ("INVALID_ARGUMENT", "model version", version)
    unknown = ("NOT_FOUND", "model name", "nope")
    for version in ("", "01", "2"):
        assert fuzz.wrong_name(_request(model_name="nope", model_version=version), SERVABLES) == unknown


@pytest.mark.parametrize("version", ["01", "2", "-1", "20 digits"])
def test_random_requests_send_the_models_own_name_with_other_versions(version):
    # They sent "2" and "x", and only with a wrong model name as well, which the server answers about first:
    # "01" (served, so answered), "-1" and a number past int64 were never sent.
    def drawn(name_and_version: tuple[str, str]) -> bool:
        name, got = name_and_version
        return name == "alltypes" and (len(got) == 20 and got.isdigit() if version == "20 digits" else got == version)

    _, got = find(fuzz.names_and_versions("alltypes"), drawn, settings=settings(database=None, max_examples=5000))
    want = {"01": None, "2": ("NOT_FOUND", "model version", got)}.get(
        version, ("INVALID_ARGUMENT", "model version", got)
    )
    assert fuzz.wrong_name(_request(model_version=got), SERVABLES) == want


def test_a_wrong_name_must_get_its_status_and_be_named():
    name = "x\u00e9" * 100
    cases = [
        (_request(model_name=name), "NOT_FOUND", "model name", f"unknown model '{name}'; this server serves: alltypes"),
        (
            _request(model_version=name),
            "INVALID_ARGUMENT",
            "model version",
            "model 'alltypes': model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the "
            f"version served (1); got '{name}'",
        ),
        (
            _request(model_version="2"),
            "NOT_FOUND",
            "model version",
            "model 'alltypes' has no version '2'; available: 1",
        ),
    ]
    req = _request()
    req.inputs[0].name = name
    cases.append((req, "INVALID_ARGUMENT", "input name", f"unexpected input '{name}' for model 'alltypes'"))
    # Every input of the model, so that the inputs pass and the outputs are checked.
    inputs = {t.name: _one_row(t) for t in CFG.inputs}
    req = encode_request("alltypes", inputs, [name], datatypes={t.name: t.datatype for t in CFG.inputs})
    assert fuzz.wrong_name(req, SERVABLES) == ("INVALID_ARGUMENT", "output name", name)
    cases.append((req, "INVALID_ARGUMENT", "output name", f"unknown output '{name}' requested from model 'alltypes'"))
    for req, want, what, details in cases:
        assert _judge(req, want, details) is None, what
        assert _judge(req, want, "something else")[0] == f"{what} not named"
        other = "INVALID_ARGUMENT" if want == "NOT_FOUND" else "NOT_FOUND"
        assert _judge(req, other, details)[0] == f"{other} for a wrong {what}"
        assert _judge(req, "OK")[0] == f"OK for a wrong {what}"
        # A long name, cut by the server, is named by its start.
        assert _judge(req, want, short_details(details.replace(name, name * 50))) is None


@pytest.mark.parametrize("unit", ["\x00", "a\n", "\u202e\\"], ids=["nul", "newline", "override-backslash"])
def test_a_wrong_name_the_server_escaped_is_named_by_its_escaped_start(unit):
    # The server shows a name with a character that is not printable escaped (wok.errors.quoted_name):
    # its start as sent is not in the details, its start escaped is.
    name = unit * 5_000
    shown = repr(name[:200])[1:-1]  # no quote in it: escaped as repr escapes it
    details = f"unknown model '{shown}'… ({len(name):,} characters in all); this server serves: alltypes"
    assert _judge(_request(model_name=name), "NOT_FOUND", details) is None
    assert _judge(_request(model_name=name), "NOT_FOUND", "unknown model '...'")[0] == "model name not named"


def _one_row(t):
    dt = fuzz.DATATYPES[t.datatype]
    if dt.name == "BYTES":
        a = fuzz.np.empty((1, 1), dtype=object)
        a[0, 0] = b"x"
        return a
    return fuzz.np.zeros((1, 1), dtype=dt.numpy)


def test_bytes_that_do_not_parse_must_get_invalid_argument():
    assert _judge(b"\xff\xff\xff", "INVALID_ARGUMENT", "message is not a valid ...") is None
    assert _judge(b"\xff\xff\xff", "NOT_FOUND", "x")[0] == "unparseable bytes"
    # Over the limit too, where not even the model's name, version and id are read (the server refuses it for its
    # size, naming no model: codec.UnreadOversized).
    unread = "request is 3 bytes, over the limit of 1 bytes (the server's --max-request-bytes); its model was not read"
    assert _judge(b"\xff\xff\xff", "INVALID_ARGUMENT", unread, max_request_bytes=1) is None
    assert _judge(b"\xff\xff\xff", "NOT_FOUND", "x", max_request_bytes=1)[0] == "unparseable bytes"
    assert _judge(b"\x0a\x01\xff" * 2, "NOT_FOUND", "x", max_request_bytes=1)[0] == "unparseable bytes"


@settings(max_examples=50, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz.long_names())
def test_long_names_are_long_and_encodable(name):
    assert fuzz.LONG_NAME_CHARS[0] <= len(name) <= fuzz.LONG_NAME_CHARS[1]
    assert _request(model_name=name).SerializeToString()  # valid UTF-8 for protobuf


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("localhost", "--target 'localhost': expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name"),
        (
            "http://127.0.0.1:8001",
            "--target 'http://127.0.0.1:8001': expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name "
            "(no URL scheme: gRPC, not HTTP)",
        ),
        (
            "127.0.0.1:8001,127.0.0.1:8002",
            "--target '127.0.0.1:8001,127.0.0.1:8002': expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name",
        ),
        (  # a gRPC name that lists several
            "ipv4:127.0.0.1:8001,127.0.0.1:8002",
            "--target 'ipv4:127.0.0.1:8001,127.0.0.1:8002': expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name",
        ),
    ],
)
def test_a_target_without_a_port_or_a_url_is_refused_before_fuzzing(target, message, monkeypatch, capsys):
    """The target went to grpc as given: without a port it dialed 443, and a URL failed every input,
    each counted as the server's answer."""
    monkeypatch.setattr(fuzz, "run", lambda *a, **k: pytest.fail("fuzzed before refusing"))
    with pytest.raises(SystemExit) as exc:
        fuzz.main(["--minutes", "0.01", "--target", target])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(f"\npython -m wok.bench.fuzz: error: {message}\n")


@pytest.mark.parametrize("minutes", ["0", "-1", "nan"])
def test_minutes_not_above_0_are_refused_before_fuzzing(minutes, monkeypatch, capsys):
    """It said "--minutes must be > 0" without the value, and NaN passed: no round fuzzed, exit 0. Refused with
    the usage, as --json and the other scripts' values are (it printed "wok fuzz: ..." alone)."""
    monkeypatch.setattr(fuzz, "run", lambda *a, **k: pytest.fail("fuzzed before refusing"))
    with pytest.raises(SystemExit) as exc:
        fuzz.main(["--minutes", minutes])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m wok.bench.fuzz "), err
    assert err.endswith(
        f"\npython -m wok.bench.fuzz: error: --minutes: expected a number > 0; got {float(minutes):g}\n"
    )


@pytest.mark.parametrize("target", ["127.0.0.1:8001", "[::1]:8001", "dns:///wok.example:8001"])
def test_a_server_target_is_fuzzed_as_given(target, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(fuzz, "run", lambda seconds, given, **k: seen.append(given) or {"schema": fuzz.SCHEMA})
    assert fuzz.main(["--minutes", "0.01", "--target", target]) == 0
    assert seen == [target]


# A run's result with an unclear answer whose reason quotes a long name: its JSON is past stdout's buffer.
_CLOSED_STDOUT_RUN = """
import sys
from wok.bench import fuzz
why = "details too long: " + "n" * 20000
fuzz.run = lambda *a, **k: {
    "schema": fuzz.SCHEMA,
    "server_verdicts": {"clear": 9, "unclear: details too long": 1},
    "unclear_answers": [{"kind": "renamed", "model": "mlp", "why": why}],
}
sys.exit(fuzz.main(["--minutes", "0.01", "--json", sys.argv[1]]))
"""


def test_a_closed_stdout_costs_no_file_and_ends_quietly(tmp_path):
    """`wok fuzz … --json x.json | head -1` lost the file: the JSON was printed first, and the broken
    pipe ended the command before the write."""
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "fuzz.json"
    read, write = os.pipe()
    os.close(read)  # the reader gone before the command starts, as `| head` leaves it once it has its lines
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CLOSED_STDOUT_RUN, str(path)], stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
    assert path.is_file(), done.stderr
    assert json.loads(path.read_text())["schema"] == fuzz.SCHEMA
    why = "details too long: " + "n" * 20000
    assert (done.returncode, done.stderr) == (
        1,
        f"python -m wok.bench.fuzz: 1 unclear answers from the server; the first ones:\n  renamed to 'mlp': {why}\n",
    )


def test_a_failed_write_is_told_under_the_command_it_was_run_as(tmp_path, monkeypatch, capsys):
    """The lines after the run began "wok fuzz:", a command there is none of; the usage and the refusals name
    `python -m wok.bench.fuzz`, as it is run."""
    import tempfile

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()

    def run(*args, **kwargs):
        folder.rmdir()  # after the up-front check: the write itself fails, as on a full disk
        return {"schema": fuzz.SCHEMA}

    monkeypatch.setattr(fuzz, "run", run)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    path = folder / "fuzz.json"
    assert fuzz.main(["--minutes", "0.01", "--json", str(path)]) == 1
    (kept,) = temp.glob("wok-bench-*")
    assert capsys.readouterr().err == (
        f"python -m wok.bench.fuzz: --json {path}: No such file or directory; the result is kept in {kept} instead\n"
    )
