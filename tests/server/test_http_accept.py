"""/metrics' format, label and escaping of names by the scrape's Accept (server/http.py's negotiate),
its media ranges weighed as RFC 9110 12.5.1 weighs them, and otherwise as prometheus_client's
exposition.choose_encoder answers, which the table test runs as its oracle; over raw sockets on loopback."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics

from wok import http
from wok.app import default_registry
from wok.metrics import WokMetrics

from .test_http import Server, responses

OPENMETRICS = b"application/openmetrics-text"
TEXT = b"text/plain"
# What Prometheus 2.x and 3.x send.
PROMETHEUS = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    "accept, expected",
    [
        # q=0 is "not acceptable" (RFC 9110 12.4.2): naming OpenMetrics so asked for anything but it.
        ("application/openmetrics-text;q=0, text/plain", TEXT),
        ("application/openmetrics-text; q=0", TEXT),
        ("application/openmetrics-text;q=0.000, */*", TEXT),
        # The text format weighed higher than OpenMetrics.
        ("application/openmetrics-text;q=0.1, text/plain;q=0.9", TEXT),
        ("text/plain;version=0.0.4, application/openmetrics-text;q=0.5", TEXT),
        ("application/openmetrics-text;q=0.4, text/*;q=0.5", TEXT),
        # OpenMetrics weighed higher, or named where the text format is not.
        (PROMETHEUS, OPENMETRICS),
        ("application/openmetrics-text;q=0.9, text/plain;q=0.1", OPENMETRICS),
        ("application/openmetrics-text", OPENMETRICS),
        ("Application/OpenMetrics-Text", OPENMETRICS),
        ("application/openmetrics-text, text/plain", OPENMETRICS),
        ("application/openmetrics-text;q=0.5, text/plain;q=0", OPENMETRICS),
        # The more specific range decides: text/plain;q=0 over */*.
        ("*/*, text/plain;q=0", OPENMETRICS),
        ("", TEXT),
        ("*/*", TEXT),
        ("application/json", TEXT),
        # A weight that is not a qvalue: the range is skipped, not read as q=1 (nor as naming it).
        ("application/openmetrics-text;q=2, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=abc", TEXT),
        # The version parameter names the OpenMetrics asked for; this server writes 1.0.0 alone. As
        # prometheus_client (exposition.choose_encoder) does, 0.0.1 (a draft before 1.0.0) is not it,
        # and the text format is served. It was OpenMetrics 1.0.0, whatever version was asked.
        ("application/openmetrics-text; version=1.0.0", OPENMETRICS),
        ('application/openmetrics-text; Version="1.0.0"', OPENMETRICS),
        ("application/openmetrics-text; version=0.0.1", TEXT),
        ("application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3", TEXT),
        ("application/openmetrics-text;version=0.0.1, application/openmetrics-text;q=0.5", OPENMETRICS),
        # A version this server does not write (prometheus_client labels its 1.0.0 text with any one
        # from 1.0.0 up, and fails on one not numeric): not the OpenMetrics it serves.
        ("application/openmetrics-text; version=9.9.9", TEXT),
        ("application/openmetrics-text; version=abc", TEXT),
        # The range naming the version served is the more specific one (RFC 9110 12.5.1).
        ("application/openmetrics-text;version=1.0.0;q=0, application/openmetrics-text, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=0, application/openmetrics-text;version=1.0.0, text/plain", OPENMETRICS),
        # A comma inside a quoted parameter value separates no ranges (RFC 9110 5.6.4).
        ('text/plain;x="a, application/openmetrics-text;y=b", text/plain;q=0.5', TEXT),
        # Prometheus 3's own Accept (scrape.ScrapeProtocolsHeaders, DefaultScrapeProtocols).
        (
            "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
            "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
            OPENMETRICS,
        ),
    ],
)
async def test_the_format_is_the_one_accept_weighs_highest(accept, expected, raw_http):
    """OpenMetrics was served whenever Accept named it, with q=0 ("not acceptable") too, and above a
    text/plain it weighed higher."""
    registry = CollectorRegistry()
    Counter("wok_test_scrapes", "a counter to render", registry=registry).inc()
    async with Server(registry) as s:
        request = b"GET /metrics HTTP/1.1\r\n" + s.host + b"Accept: " + accept.encode() + b"\r\nConnection: close\r\n"
        answer = await raw_http(s.port, request + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    [ctype] = [line for line in top.split(b"\r\n") if line.startswith(b"Content-Type: ")]
    assert ctype.startswith(b"Content-Type: " + expected), (accept, ctype)
    assert body.endswith(b"# EOF\n") == (expected == OPENMETRICS), body[-40:]


def test_the_openmetrics_version_compared_is_the_one_written():
    """negotiate takes a range naming OPENMETRICS_VERSION as naming what render writes."""
    assert f"; version={http.OPENMETRICS_VERSION};" in openmetrics.CONTENT_TYPE_LATEST


V0 = "text/plain; version=0.0.4; charset=utf-8"
V1 = "text/plain; version=1.0.0; charset=utf-8; escaping=underscores"
V1_UTF8 = "text/plain; version=1.0.0; charset=utf-8; escaping=allow-utf-8"


@pytest.mark.parametrize(
    "accept, expected",
    [
        # prometheus_client's default (exposition.choose_encoder): 0.0.4 unless a text/plain asks for 1.0.0 up.
        ("", V0),
        ("*/*", V0),
        ("text/plain", V0),
        ("text/plain;version=0.0.4", V0),
        ("application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3", V0),
        ("text/plain;version=1.0.0", V1),
        ('text/plain; Version="1.0.0"', V1),
        ("text/plain;version=2", V1),  # as prometheus_client: any version from 1.0.0 up is written as 1.0.0
        # Not numbers, not 1.0.0 up (prometheus_client raises on the first).
        ("text/plain;version=abc", V0),
        ("text/plain;version=1.0", V0),
        # Of several text/plain ranges, the one weighed highest names the version; q=0 is "not acceptable".
        ("text/plain;version=0.0.4;q=0.2, text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3", V1_UTF8),
        ("text/plain;version=0.0.4, text/plain;version=1.0.0;q=0.5", V0),
        ("text/plain;version=1.0.0;q=0, text/plain", V0),
        # Prometheus 3 with OpenMetrics weighed below the text format (its scrape_protocols reordered).
        (
            "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4",
            V1_UTF8,
        ),
    ],
)
async def test_the_text_formats_version_is_the_one_its_accept_asks_for(accept, expected, raw_http):
    """Every text answer was labelled `version=1.0.0` (prometheus_client's CONTENT_TYPE_LATEST since
    0.22), Prometheus 2's `text/plain;version=0.0.4` too; prometheus_client's own negotiation labels
    it 0.0.4 unless a text/plain range asks for 1.0.0 or later. Scrapes asking for either version
    get the same text, each labelled as it asked."""
    registry = CollectorRegistry()
    Counter("wok_test_scrapes", "a counter to render", registry=registry).inc()
    async with Server(registry) as s:
        asked = b"GET /metrics HTTP/1.1\r\n" + s.host + b"Accept: " + accept.encode() + b"\r\n\r\n"
        other = "text/plain" if expected != V0 else "text/plain;version=1.0.0"  # pipelined: the same text
        last = b"GET /metrics HTTP/1.1\r\n" + s.host + f"Accept: {other}\r\nConnection: close\r\n\r\n".encode()
        answer = await raw_http(s.port, asked + last)
    (top, body), (other_top, other_body) = responses(answer, [False, False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert f"\r\nContent-Type: {expected}\r\n".encode() in top, (accept, top)
    assert f"\r\nContent-Type: {V1 if expected == V0 else V0}\r\n".encode() in other_top, other_top
    assert body == other_body and b"wok_test_scrapes_total 1.0\n" in body


def prometheus_3(protocols: str, escaping: str = "allow-utf-8", *, every: bool = False) -> str:
    """The Accept Prometheus 3 sends for its scrape_protocols (scrape.acceptHeader): each protocol's
    media type with `escaping` (metric_name_escaping_scheme; allow-utf-8 by default) on the 1.0.0
    text formats (on every one with `every`, as 3.0 wrote it), weighed from q=0.6 down, then */*."""
    types = {
        "PrometheusProto": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
        "PrometheusText0.0.4": "text/plain;version=0.0.4",
        "PrometheusText1.0.0": "text/plain;version=1.0.0",
        "OpenMetricsText0.0.1": "application/openmetrics-text;version=0.0.1",
        "OpenMetricsText1.0.0": "application/openmetrics-text;version=1.0.0",
    }
    ranges = []
    for weight, protocol in zip(range(6, 0, -1), protocols.split(), strict=False):
        versioned = every or protocol in ("PrometheusText1.0.0", "OpenMetricsText1.0.0")
        ranges.append(types[protocol] + (f";escaping={escaping}" if versioned else "") + f";q=0.{weight}")
    return ",".join([*ranges, f"*/*;q=0.{6 - len(ranges)}"])


PROMETHEUS_3 = "OpenMetricsText1.0.0 OpenMetricsText0.0.1 PrometheusText1.0.0 PrometheusText0.0.4"
PROTO_FIRST = "PrometheusProto " + PROMETHEUS_3
# What Debian's prometheus 2.42 sends (read off its scrape), with --enable-feature=native-histograms second.
PROMETHEUS_2_PROTO = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    "accept, like",
    [
        # Answered as choose_encoder answers (like None): the same Content-Type, the same body.
        ("", None),
        ("*/*", None),
        ("text/*", None),
        ("garbage", None),
        ("application/json", None),
        ("text/plain;q=abc", None),
        ("text/plain", None),
        ("text/plain;version=0.0.4", None),
        ("text/plain;version=1.0.0", None),
        ("text/plain;version=2", None),
        ("text/plain;version=1.0", None),
        ("text/plain;version=0.0.4;q=0.2, text/plain;version=1.0.0;q=0.3", None),
        ("application/openmetrics-text", None),
        ("application/openmetrics-text;version=1.0.0", None),
        ("application/openmetrics-text;version=0.0.1", None),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", None),
        # The escaping a 1.0.0 range asks for: named in the Content-Type, the names written in it
        # (dots doubles each underscore: wok__test__scrapes__total); another value is underscores.
        ("text/plain;version=1.0.0;escaping=underscores", None),
        ("text/plain;version=1.0.0;escaping=allow-utf-8", None),
        ("text/plain;version=1.0.0;escaping=dots", None),
        ("text/plain;version=1.0.0;escaping=values", None),
        ("text/plain;version=1.0.0;escaping=bogus", None),
        ("text/plain;version=1.0.0;escaping=Dots", None),
        ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8", None),
        ("application/openmetrics-text;version=1.0.0;escaping=dots", None),
        # A range that names no 1.0.0 up has its escaping read by neither.
        ("text/plain;version=0.0.4;escaping=dots", None),
        ("text/plain;escaping=dots", None),
        ("application/openmetrics-text;escaping=dots", None),
        # Prometheus 2 (2.42, as Debian ships it: no scrape_protocols) and 3 (each scrape_protocols,
        # each metric_name_escaping_scheme; 3.0 put the escaping on every range).
        (PROMETHEUS, None),
        (PROMETHEUS_2_PROTO, None),
        (prometheus_3(PROMETHEUS_3), None),
        (prometheus_3(PROMETHEUS_3, every=True), None),
        (prometheus_3(PROTO_FIRST), None),
        (prometheus_3(PROMETHEUS_3, "underscores"), None),
        (prometheus_3(PROMETHEUS_3, "dots"), None),
        (prometheus_3("PrometheusText1.0.0 OpenMetricsText1.0.0"), None),
        (prometheus_3("PrometheusText1.0.0", "dots"), None),
        (prometheus_3("PrometheusText1.0.0", "values"), None),
        (prometheus_3("PrometheusText0.0.4"), None),
        (prometheus_3("OpenMetricsText0.0.1 PrometheusText0.0.4"), None),
        (prometheus_3("PrometheusProto PrometheusText1.0.0", "dots"), None),
        # Where this server answers otherwise, `like` is the Accept choose_encoder answers as it does.
        # Weights: choose_encoder takes the first range in Accept's order, q=0 ("not acceptable") too;
        # here the one weighed highest, as client_golang's expfmt.Negotiate does.
        ("text/plain;version=1.0.0;q=0", ""),
        ("text/plain;version=1.0.0;q=0, text/plain", ""),
        ("text/plain;version=0.0.4, text/plain;version=1.0.0;q=0.5", "text/plain;version=0.0.4"),
        ("application/openmetrics-text;q=0", ""),
        ("application/openmetrics-text;q=0, text/plain", "text/plain"),
        ("application/openmetrics-text;q=0.1, text/plain;q=0.9", "text/plain"),
        # A version other than the one written: choose_encoder labels 1.0.0's text with it, or raises
        # (TypeError) on one not numeric or quoted (RFC 9110 5.6.6: the same value as unquoted).
        ("application/openmetrics-text;version=2.0.0", ""),
        ("application/openmetrics-text;version=abc", ""),
        ("text/plain;version=abc", ""),
        ('text/plain; version="1.0.0"', "text/plain;version=1.0.0"),
        # Media types are case-insensitive (RFC 9110 8.3.1); choose_encoder compares them as written.
        ("Application/OpenMetrics-Text", "application/openmetrics-text"),
        ("TEXT/PLAIN;version=1.0.0", "text/plain;version=1.0.0"),
        # OpenMetrics in values: labelled so, written as in underscores, which is how values writes
        # a legacy name (every one of wok's: test_every_name_wok_writes_is_a_legacy_one); the
        # writer of choose_encoder's prefixes each sample's name with U__ (a sample of no family).
        (
            "application/openmetrics-text;version=1.0.0;escaping=values",
            (
                "application/openmetrics-text;version=1.0.0;escaping=values",
                "application/openmetrics-text;version=1.0.0",
            ),
        ),
        (prometheus_3(PROMETHEUS_3, "values"), (prometheus_3(PROMETHEUS_3, "values"), PROMETHEUS)),
    ],
)
async def test_the_answer_is_choose_encoders_but_where_the_table_says(accept, like, raw_http):
    """prometheus_client's choose_encoder is the oracle: each Accept gets the Content-Type and the body
    (format, and names in the escaping asked for) it gets from choose_encoder, or, where the row says
    so, those choose_encoder gives another Accept. Every text answer was written in underscores, and
    labelled so whatever escaping was asked for; OpenMetrics named no escaping at all."""
    registry = CollectorRegistry()
    Counter("wok_test_scrapes", "a counter to render", ["model_instance"], registry=registry).labels("0").inc()

    def oracle(header: str) -> tuple[str, bytes | None]:
        try:
            encoder, content_type = choose_encoder(header)
        except TypeError as exc:  # a version it cannot compare
            return f"raises {exc}", None
        return content_type, encoder(registry)

    async with Server(registry) as s:
        request = b"GET /metrics HTTP/1.1\r\n" + s.host + b"Accept: " + accept.encode() + b"\r\nConnection: close\r\n"
        answer = await raw_http(s.port, request + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    [content_type] = [line[14:].decode() for line in top.split(b"\r\n") if line.startswith(b"Content-Type: ")]
    type_like, body_like = (accept, accept) if like is None else like if isinstance(like, tuple) else (like, like)
    assert (content_type, body) == (oracle(type_like)[0], oracle(body_like)[1]), (accept, like, body[:80])
    if like is not None:  # a row of the table's must be one where choose_encoder answers otherwise
        assert oracle(accept) != (content_type, body), (accept, "choose_encoder answers it so: a row for None")


async def test_scrapes_asking_for_different_escapings_get_each_its_own(raw_http):
    """A render is shared by the scrapes asking for its format and escaping: a scrape pipelined
    behind one asking for dots gets its own names, not dots' (the render's key holds the escaping)."""
    registry = CollectorRegistry()
    Counter("wok_test_scrapes", "a counter to render", registry=registry).inc()
    accepts = ["text/plain;version=1.0.0;escaping=dots", "text/plain", "application/openmetrics-text;version=1.0.0"]
    accepts.append("application/openmetrics-text;version=1.0.0;escaping=dots")
    async with Server(registry) as s:
        request = b"".join(b"GET /metrics HTTP/1.1\r\n" + s.host + f"Accept: {a}\r\n\r\n".encode() for a in accepts)
        last = b"GET /metrics HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n"
        answer = await raw_http(s.port, request + last)
    answers = responses(answer, [False] * 5)
    names = [re.findall(rb"^(wok_\S+) ", body, re.MULTILINE) for _, body in answers]
    assert names == [
        [b"wok__test__scrapes__total", b"wok__test__scrapes__created"],
        [b"wok_test_scrapes_total", b"wok_test_scrapes_created"],
        [b"wok_test_scrapes_total", b"wok_test_scrapes_created"],
        [b"wok__test__scrapes__total", b"wok__test__scrapes__created"],
        [b"wok_test_scrapes_total", b"wok_test_scrapes_created"],
    ], names


def test_every_name_wok_writes_is_a_legacy_one():
    """Metric and label names of a server's registry (default_registry's collectors and WokMetrics,
    every family it can write but the GPU's) are `[a-zA-Z_][a-zA-Z0-9_]*`: values escaping leaves
    each as it is, as underscores does, so OpenMetrics asked for in values is written in
    underscores (negotiate), and no name has a colon, which prometheus_client's OpenMetrics writer
    turns into `_` in its samples alone (prometheus/client_python#1177)."""
    registry = default_registry()
    metrics = WokMetrics(registry, gpu=False)
    metrics.grpc_port = 8001
    metrics.faults = lambda: [("m", 0, "slow", 1)]
    model = metrics.model("m", 1)
    model.record_slack(0.001)
    metrics.record_loop_lag(0.001)
    body = openmetrics.generate_latest(registry).decode()
    names = set(re.findall(r"^# TYPE (\S+) ", body, re.MULTILINE))
    names |= {n for line in body.splitlines() if not line.startswith("#") for n in re.findall(r'[{,](\w+)="', line)}
    assert {"wok_server_info", "wok_injected_faults", "wok_event_loop_lag_seconds", "process_cpu_seconds"} <= names
    legacy = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
    assert [name for name in sorted(names) if not legacy.fullmatch(name)] == []
