"""/metrics' format by the scrape's Accept, its media ranges weighed as RFC 9110 12.5.1 weighs them
(server/http.py's wants_openmetrics), over raw sockets on loopback."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics import exposition as openmetrics

from wok import http

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
    """wants_openmetrics takes a range naming OPENMETRICS_VERSION as naming what render writes."""
    assert f"; version={http.OPENMETRICS_VERSION};" in openmetrics.CONTENT_TYPE_LATEST


V0 = "text/plain; version=0.0.4; charset=utf-8"
V1 = "text/plain; version=1.0.0; charset=utf-8; escaping=underscores"


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
        ("text/plain;version=0.0.4;q=0.2, text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3", V1),
        ("text/plain;version=0.0.4, text/plain;version=1.0.0;q=0.5", V0),
        ("text/plain;version=1.0.0;q=0, text/plain", V0),
        # Prometheus 3 with OpenMetrics weighed below the text format (its scrape_protocols reordered).
        ("text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4", V1),
    ],
)
async def test_the_text_formats_version_is_the_one_its_accept_asks_for(accept, expected, raw_http):
    """Every text answer was labelled `version=1.0.0` (prometheus_client's CONTENT_TYPE_LATEST since
    0.22), Prometheus 2's `text/plain;version=0.0.4` too; prometheus_client's own negotiation labels
    it 0.0.4 unless a text/plain range asks for 1.0.0 or later. Scrapes asking for either version
    share one render, each labelled as it asked."""
    registry = CollectorRegistry()
    Counter("wok_test_scrapes", "a counter to render", registry=registry).inc()
    async with Server(registry) as s:
        asked = b"GET /metrics HTTP/1.1\r\n" + s.host + b"Accept: " + accept.encode() + b"\r\n\r\n"
        other = "text/plain" if expected == V1 else "text/plain;version=1.0.0"  # pipelined: the same render
        last = b"GET /metrics HTTP/1.1\r\n" + s.host + f"Accept: {other}\r\nConnection: close\r\n\r\n".encode()
        answer = await raw_http(s.port, asked + last)
    (top, body), (other_top, other_body) = responses(answer, [False, False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert f"\r\nContent-Type: {expected}\r\n".encode() in top, (accept, top)
    assert f"\r\nContent-Type: {V0 if expected == V1 else V1}\r\n".encode() in other_top, other_top
    assert body == other_body and b"wok_test_scrapes_total 1.0\n" in body
