"""bench/cli.py: `--metrics-url auto` takes a /metrics only if it is the target's server's (its
wok_server_info names the target's gRPC port), and says why when it takes none.

Port 8002, where `auto` looks, may be anyone's here: the decision is tested on candidate URLs
of servers started on port 0 (`_vet_metrics_url`), and the CLI with the port auto looks at
pointed at one of them (AUTO_METRICS_PORT)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from wok.bench import cli

from .conftest import WEB_PAGE, serving


def _other_port(port: int) -> str:
    return str(port + 1 if port < 65535 else port - 1)


@pytest.fixture(scope="module")
def refused_url():
    """A loopback URL where nothing listens: a port held bound, never listened on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/metrics"


@pytest.fixture(scope="module")
def foreign_url():
    """The /metrics of a server that is not wok: Prometheus text with no wok_server_info."""
    with serving(b"# TYPE nv_inference_count counter\nnv_inference_count 267\n", "text/plain; version=0.0.4") as url:
        yield url


@pytest.fixture(scope="module")
def page_url():
    """A URL that answers a web page, not Prometheus text (a wrong port: a dashboard's, a proxy's)."""
    with serving(*WEB_PAGE) as url:
        yield url


def test_a_url_that_answers_a_web_page_is_said_to_answer_no_prometheus_text(page_url):
    """It said "no answer" (scrape() takes a page as no snapshot): the operator looked for a server down."""
    said: list[str] = []
    assert cli._vet_metrics_url(page_url, "127.0.0.1:18001", explicit=True, say=said.append) == page_url
    assert said == [
        f"--metrics-url {page_url}: answered, but not Prometheus text now; scraped at each step all the same "
        "(`-` while none)"
    ]
    said.clear()
    assert cli._vet_metrics_url(page_url, "127.0.0.1:18001", explicit=False, say=said.append) is None
    assert said == [
        f"--metrics-url auto: {page_url} answered, but not Prometheus text; server-side columns `-` "
        "(give --metrics-url)"
    ]


def test_a_url_that_answers_an_http_error_is_said_to(bench_server):
    """A wrong path on the right server: it said "no answer" too."""
    url = bench_server.http_url() + "/no-such-path"
    said: list[str] = []
    assert cli._vet_metrics_url(url, bench_server.target, explicit=True, say=said.append) == url
    assert said == [f"--metrics-url {url}: answered HTTP 404 now; scraped at each step all the same (`-` while none)"]


def test_auto_takes_the_metrics_of_the_targets_own_server(bench_server, metrics_url):
    said: list[str] = []
    assert cli._vet_metrics_url(metrics_url, bench_server.target, explicit=False, say=said.append) == metrics_url
    assert said == [f"server-side columns from {metrics_url} (the server of {bench_server.target})"]


def test_auto_leaves_out_another_servers_metrics_and_says_whose_they_are(bench_server, metrics_url):
    target = f"127.0.0.1:{_other_port(bench_server.port)}"
    said: list[str] = []
    assert cli._vet_metrics_url(metrics_url, target, explicit=False, say=said.append) is None
    assert said == [
        f"--metrics-url auto: {metrics_url} is the metrics of the server on gRPC port {bench_server.port}, "
        f"not of {target}; server-side columns `-` (give --metrics-url)"
    ]


def test_a_url_given_for_another_server_is_scraped_as_given_with_a_warning(bench_server, metrics_url):
    target = f"127.0.0.1:{_other_port(bench_server.port)}"
    said: list[str] = []
    assert cli._vet_metrics_url(metrics_url, target, explicit=True, say=said.append) == metrics_url
    assert said == [
        f"--metrics-url {metrics_url} is the metrics of the server on gRPC port {bench_server.port}, not of "
        f"{target}; scraped as given (right only if a port mapping stands between)"
    ]


def test_auto_where_nothing_answers_takes_none_and_says_so(refused_url):
    said: list[str] = []
    assert cli._vet_metrics_url(refused_url, "127.0.0.1:18001", explicit=False, say=said.append) is None
    assert said == [
        f"--metrics-url auto: nothing answers at {refused_url}; server-side columns `-` (give --metrics-url)"
    ]
    said.clear()
    assert cli._vet_metrics_url(refused_url, "127.0.0.1:18001", explicit=True, say=said.append) == refused_url
    assert said == [f"--metrics-url {refused_url}: no answer now; scraped at each step all the same (`-` while none)"]


def test_auto_leaves_out_a_server_that_is_not_wok(foreign_url):
    said: list[str] = []
    assert cli._vet_metrics_url(foreign_url, "127.0.0.1:18001", explicit=False, say=said.append) is None
    assert len(said) == 1 and said[0].startswith(f"--metrics-url auto: {foreign_url} names no wok server")
    assert said[0].endswith("server-side columns `-` (give --metrics-url)")
    said.clear()
    # Given: taken (Triton's /metrics has none of wok's series, but the user asked for it).
    assert cli._vet_metrics_url(foreign_url, "127.0.0.1:18001", explicit=True, say=said.append) == foreign_url
    assert said == [f"server-side columns from {foreign_url} (as given: it names no gRPC port to check it against)"]


def test_auto_says_what_it_found_at_port_8002_whatever_is_there(capsys):
    # Whatever answers on 8002 here (nothing, or some server), it is no server of gRPC port 1.
    assert cli._metrics_url("auto", "127.0.0.1:1") is None
    err = capsys.readouterr().err
    assert "wok bench: --metrics-url auto: " in err and "http://127.0.0.1:8002/metrics" in err
    assert err.rstrip().endswith("server-side columns `-` (give --metrics-url)")


def test_a_ramp_does_not_report_another_servers_metrics_as_its_targets(
    bench_server, metrics_url, foreign_url, monkeypatch, tmp_path, wok_cli
):
    """Another server's /metrics where auto looks: the ramp leaves the server view out, and says so."""
    # raising=False: before AUTO_METRICS_PORT, auto looked at the real 8002 (and said nothing either way).
    monkeypatch.setattr(cli, "AUTO_METRICS_PORT", urlsplit(foreign_url).port, raising=False)
    out = tmp_path / "ramp.json"
    argv = [
        "bench", "ramp", "--target", bench_server.target, "--model", "mlp", "--workers", "1", "--steps", "20",
        "--step-duration", "0.3s", "--warmup", "0.1s", "--json", str(out),
    ]  # fmt: skip
    status, _, stderr = wok_cli(*argv)
    assert status == 0, stderr
    assert f"wok bench: --metrics-url auto: {foreign_url} names no wok server" in stderr
    result = json.loads(out.read_text())
    assert result["config"]["metrics_url"] is None
    assert result["steps"][0].get("server") is None

    # Where auto finds the target's own server, it takes its metrics and says which URL it scrapes.
    monkeypatch.setattr(cli, "AUTO_METRICS_PORT", urlsplit(metrics_url).port, raising=False)
    status, _, stderr = wok_cli(*argv)
    assert status == 0, stderr
    assert f"wok bench: server-side columns from {metrics_url} (the server of {bench_server.target})" in stderr
    result = json.loads(out.read_text())
    assert result["config"]["metrics_url"] == metrics_url
    assert result["steps"][0]["server"] is not None
