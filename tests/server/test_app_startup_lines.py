"""Where the server serves, shown once at start-up.

`wok serve` prints its start-up lines ("wok: serving ...", "wok: metrics on http://...", ...), which
scripts and tests parse, whatever --log-level; WokServer logs the same facts for a library caller,
and `wok serve` turns that off (announce=False), or each fact would show twice on a terminal."""

from __future__ import annotations

import logging

import pytest


@pytest.mark.parametrize(
    ("args", "metrics_line"),
    [
        (("--health-port", "0"), "wok: metrics on http://{http}/metrics"),
        # With metrics on, nothing said the admin API was served: off loopback only a warning named it.
        (("--admin",), "wok: metrics on http://{http}/metrics\nwok: admin API on http://{http} (/admin/*, /events)"),
        (
            ("--no-metrics", "--admin"),
            "wok: metrics off (--no-metrics); admin API on http://{http} (/metrics answers 404)",
        ),
    ],
)
def test_wok_serve_shows_each_start_up_fact_once(start_server, args, metrics_line):
    sp = start_server("--models", "mlp", "--torch-threads", "1", *args)
    sp.wait_for_line("wok: gRPC security: ")  # the last of them
    with sp.lines:
        lines = list(sp.log)
    http = next(line for line in lines if line.startswith("wok: metrics ")).split("http://")[1].split()[0]
    http = http.removesuffix("/metrics")
    expected = [*metrics_line.format(http=http).split("\n"), f"wok: serving mlp on {sp.target}"]
    if "--health-port" in args:
        health = sp.wait_for_line("wok: health (plaintext) on ").rsplit(" ", 1)[1]
        expected.append(f"wok: health (plaintext) on {health}")
    else:
        health = None
    expected.append("wok: gRPC security: plaintext, no token")
    facts = (sp.target, http, health or sp.target, "gRPC security", "metrics o")
    assert [line for line in lines if any(fact in line for fact in facts)] == expected
    assert sp.terminate() == 0


def test_wok_serve_says_when_it_serves_no_metrics_port(start_server):
    sp = start_server("--models", "mlp", "--torch-threads", "1", "--metrics-port", "-1")
    assert sp.wait_for_line("wok: metrics ") == "wok: metrics off (--metrics-port -1): no HTTP port"
    assert sp.terminate() == 0


async def test_a_library_caller_gets_the_start_up_facts_logged(serve, caplog):
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(models=("mlp",), health_port=0) as server:
        logged = [r.getMessage() for r in caplog.records if r.name == "wok"]
        http = f"127.0.0.1:{server.http.port}"
        assert f"wok serving mlp on 127.0.0.1:{server.port}" in logged
        assert "gRPC security: plaintext, no token" in logged
        assert f"health (plaintext, grpc.health.v1 only) on 127.0.0.1:{server.health_port}" in logged
        assert f"metrics on http://{http}/metrics" in logged


async def test_a_library_caller_gets_the_admin_apis_address_logged_with_metrics_on(serve, caplog):
    caplog.set_level(logging.INFO, logger="wok")
    async with serve(models=("mlp",), admin=True) as server:
        logged = [r.getMessage() for r in caplog.records if r.name == "wok"]
        http = f"127.0.0.1:{server.http.port}"
        assert logged[logged.index(f"metrics on http://{http}/metrics") + 1] == (
            f"admin API on http://{http} (/admin/*, /events)"
        )
