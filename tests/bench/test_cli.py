"""bench/cli.py: where `--metrics-url auto` looks for the server's /metrics."""

from __future__ import annotations

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
