"""A reader that closes stdout early (`wok … | head`): the commands write their files first, and end
quietly (status 1, no traceback) at the table they can no longer print."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _closed_stdout(*args: str) -> tuple[int, str]:
    """Run `python -m wok ARGS` with stdout a pipe whose reader is gone before it starts (what
    `| head` leaves once it has read its lines): (status, stderr)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "wok", *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr


PLAN = ["plan", "--peak-qps", "100", "--t-batch", "20ms", "--batch-size", "8"]
SIMULATE = ["simulate", "--alpha", "1ms", "--beta", "1ms", "--steps", "10,20", "--step-duration", "2s"]


@pytest.mark.parametrize(
    ("argv", "schema"),
    [(PLAN, "wok.plan/1"), (SIMULATE, "wok.bench/2")],
    ids=["plan", "simulate"],
)
def test_a_closed_stdout_costs_no_file_and_ends_quietly(argv, schema, tmp_path):
    """`wok plan … --json bp.json | head -1` exited 1 with bp.json not written (the table came first,
    and rich's console exits when it cannot print); `wok simulate … | head` the same, or, with the
    table read, lost the utilization line in a BrokenPipeError traceback."""
    path = tmp_path / "out.json"
    status, err = _closed_stdout(*argv, "--json", str(path))
    assert path.is_file(), err
    assert json.loads(path.read_text())["schema"] == schema
    assert (status, err) == (1, f"wok {argv[0]}: wrote {path} (--json)\n")  # each file written is named


def test_a_failed_write_is_told_though_stdout_is_closed(tmp_path):
    """A --csv that cannot be written, stdout closed: it exited 1 and said nothing, the table's broken
    pipe having replaced the write's error."""
    ok = tmp_path / "ok.json"
    status, err = _closed_stdout(*SIMULATE, "--json", str(ok), "--csv", "/dev/full")
    assert (status, err) == (
        2,
        f"wok simulate: wrote {ok} (--json)\nwok simulate: --csv /dev/full: No space left on device\n",
    )


def test_a_ramp_writes_its_result_before_a_closed_stdout_ends_it(bench_server, tmp_path):
    path = tmp_path / "ramp.json"
    ramp = ["bench", "ramp", "--target", bench_server.target, "--metrics-url", "none", "--steps", "20"]
    ramp += ["--step-duration", "1s", "--warmup", "0s", "--workers", "1", "--json", str(path)]
    status, err = _closed_stdout(*ramp)
    assert path.is_file(), err
    assert json.loads(path.read_text())["schema"] == "wok.bench/2"
    assert status == 1, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("reader_gone", [False, True], ids=["stdout-open", "stdout-closed"])
def test_only_stdouts_own_broken_pipe_ends_a_command_quietly(reader_gone, monkeypatch):
    """A pipe to anything else (a worker) that breaks while stdout is still read is raised as before."""
    from wok.bench.cli import _quiet_when_stdout_closes

    read, write = os.pipe()
    if reader_gone:
        os.close(read)
    stdout = open(write, "w")  # noqa: SIM115 - closed below, after the command's redirection
    monkeypatch.setattr(sys, "stdout", stdout)

    def run(args) -> int:
        raise BrokenPipeError(32, "a pipe broke")

    try:
        if reader_gone:
            assert _quiet_when_stdout_closes(run)(None) == 1
            print("into /dev/null now", flush=True)  # no second BrokenPipeError, here nor at exit
        else:
            with pytest.raises(BrokenPipeError, match="a pipe broke"):
                _quiet_when_stdout_closes(run)(None)
    finally:
        stdout.close()
        if not reader_gone:
            os.close(read)


def _table(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "wok", *args], capture_output=True, text=True, timeout=120).stdout


@pytest.mark.parametrize("redirect", ["truncate", "append"])
def test_json_to_dev_stdout_redirected_to_a_file_keeps_the_json_and_the_table_whole(redirect, tmp_path):
    """`wok plan … --json /dev/stdout > out.json`: the JSON was written through a second open of the
    file, which truncated it, and the table then landed over the JSON's start (44 lines of a mix);
    with `>>` the JSON overwrote what the file held. Now the JSON goes through stdout itself,
    before the table, and `>>` appends both."""
    out = tmp_path / "out.json"
    before = "an earlier line\n" if redirect == "append" else ""
    out.write_text(before)
    with open(out, "a" if redirect == "append" else "w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "wok", *PLAN, "--json", "/dev/stdout"], stdout=f, stderr=subprocess.PIPE, timeout=120
        )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.startswith(before)
    plan, end = json.JSONDecoder().raw_decode(text, len(before))
    assert plan["schema"] == "wok.plan/1"
    assert text[end:].lstrip("\n") == _table(*PLAN)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_json_to_dev_stdout_when_stdout_is_a_socket_is_written(tmp_path):
    """A service manager's stdout is often a socket, which /dev/stdout cannot open (ENXIO): the run
    ended with `--json /dev/stdout: No such device or address`, its result only in a temporary file."""
    import socket

    mine, theirs = socket.socketpair()
    with mine:
        with theirs:
            done = subprocess.run(
                [sys.executable, "-m", "wok", *PLAN, "--json", "/dev/stdout"],
                stdout=theirs,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
            )
        got = b"".join(iter(lambda: mine.recv(1 << 16), b"")).decode()
    assert done.returncode == 0, done.stderr
    plan, end = json.JSONDecoder().raw_decode(got)
    assert plan["schema"] == "wok.plan/1" and got[end:].lstrip("\n") == _table(*PLAN)
