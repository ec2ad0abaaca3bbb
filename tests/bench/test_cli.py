"""bench/cli.py: where `--metrics-url auto` looks for the server's /metrics, option checks, --token-file."""

from __future__ import annotations

import json

import pytest

from wok.bench.cli import _metrics_url


@pytest.mark.parametrize(
    "target", ["127.0.0.1:1,127.0.0.1:2", "dns:///wok-headless.wok.svc.cluster.local:8001", "ipv4:127.0.0.1:1"]
)
def test_auto_scrapes_nothing_for_several_servers(target):
    assert _metrics_url("auto", target) is None


def test_explicit_and_none_are_taken_as_given():
    assert _metrics_url("http://10.0.0.1:9000/metrics", "a:1,b:2") == "http://10.0.0.1:9000/metrics"
    assert _metrics_url("none", "127.0.0.1:1") is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--start-at", "soon"],
            "wok bench: --start-at: expected a Unix time in seconds, e.g. $(date +%s); got 'soon'",
        ),
        (["--start-at", "1900000000", "--refine", "2"], "wok bench: start_at does not go with refine"),
        (["--start-at", "1900000000", "--replicas", "2"], "wok bench: --start-at is for plain ramps"),
        (["--host-probe", "2s", "--replicas", "2"], "wok bench: --host-probe is for plain ramps"),
        (["--host-probe=-1s"], "wok bench: invalid duration '-1s': expected a number >= 0"),
    ],
)
def test_mistaken_options_exit_2_naming_the_option(extra, message, capsys):
    from wok.__main__ import main

    # Refused before anything connects: the target need not exist (with --replicas there is none).
    target = [] if "--replicas" in extra else ["--target", "127.0.0.1:1"]
    assert main(["bench", "ramp", *target, *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "1", "--target", "127.0.0.1:1"], "--target with --replicas: the bench ramps the replicas"),
        (["--replicas", "1", "--admin-url", "http://127.0.0.1:9"], "--admin-url with --replicas"),
        (["--serve-args", "--models mlp"], "--serve-args is for --replicas: without it no server is started"),
        (["--admin-url", "http://127.0.0.1:9"], "--admin-url is where --fault slow:/fail: go; no --fault"),
        (["--workers", "0"], "--workers must be at least 1; got 0"),
        (["--hedge-after", "50ms"], "--hedge-after is the wok balancer's: it does nothing with --balancer grpc"),
        # Two replicas are two targets: the wok balancer unless told, which has no trailers to read.
        (["--replicas", "2", "--server-timing"], "not with --rpc stream or --balancer wok (the default for several"),
    ],
)
def test_options_that_would_be_ignored_together_are_refused(argv, message, capsys):
    """Each used to be ignored (the run went elsewhere than asked, or did not do what was asked),
    or, for --server-timing with replicas, refused only after starting them, in a worker's words."""
    from wok.__main__ import main

    assert main(["bench", "ramp", *argv]) == 2
    assert message in capsys.readouterr().err


def test_token_file_sends_the_first_token_of_the_servers_own_file(start_server, tmp_path, capsys):
    """The server's token file may list several tokens on a line (a rotation); the bench sent the
    whole line "A,B" as one token, and the server refused it (exit 1)."""
    from wok.__main__ import main

    first, second = "tok-A-1b0c4ee6a1f94c8a8d1e", "tok-B-9f21d7c3e5a64b0f9c2a"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the rotation: new, old\n{first},{second}\n")
    server = start_server("--models", "mlp", "--torch-threads", "1", "--auth-token-file", str(tokens))
    out = tmp_path / "r.json"
    argv = ["bench", "ramp", "--target", server.target, "--steps", "20", "--step-duration", "0.5s", "--warmup", "0.1s"]
    argv += ["--workers", "1", "--metrics-url", "none", "--token-file", str(tokens), "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["steps"][0]["success_rate"] == 1.0 and result["config"]["token"] is True
    assert first not in out.read_text()
    empty = tmp_path / "empty"
    empty.write_text("# nothing but a comment\n")
    assert main([*argv[:-4], "--token-file", str(empty)]) == 2
    assert f"--token-file {empty} holds no token" in capsys.readouterr().err
