"""The page's controls in headless Chromium, on `wok demo --simulate` (no server to start): they
follow the configuration rather than the page's fixed limits (and a change made in another tab or
through the API), refuse emptied fields, and say so when the demo is gone; the figures blank once
their events stop, and the rest of the page says it is not live (until a demo is back, and while
the stream is up but no tick comes); the page loads without a console error."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest

pytestmark = pytest.mark.timeout(120)


def test_the_controls_follow_the_configuration_and_refuse_what_they_cannot_send(start_demo, new_context):
    args = ("--simulate", "--rate", "50", "--max-queue-delay", "250ms", "--max-batch-size", "64")
    demo = start_demo(*args, ready=False)
    page = open_page(new_context(), demo.ready().url)

    # A 250 ms window is past the slider's 100 ms in the page: Apply unchanged must keep it.
    assert page.input_value("#delay") == "250" and page.input_value("#max-batch") == "64"
    apply_batching(page)
    assert page.inner_text("#message") == "batching: max 64, delay 250 ms"

    # The arrivals the load generator could not send are shown (none here): from a load event, not
    # the page's own "0" before one.
    page.wait_for_function("() => S.loads.length >= 1", timeout=10_000, polling=100)
    assert page.get_attribute("#skipped", "data-value") == "0"

    # An emptied field is refused in the page, not sent as 0.
    page.fill("#rate", "")
    page.click("#apply-rate")
    assert wait_for_message(page, "rate:") == "rate: expected a number; got nothing"
    with urllib.request.urlopen(demo.url + "api/config", timeout=10) as r:
        assert json.loads(r.read())["load"]["rate"] == 50

    # The demo gone: the page says so instead of nothing.
    assert demo.stop() == 0
    page.fill("#rate", "80")
    page.click("#apply-rate")
    wait_for_message(page, "/api/load: the demo did not answer")
    page.close()


def set_range(page, selector: str, value: float) -> None:
    """Move a slider as a user does: set it and fire its input event."""
    page.eval_on_selector(selector, f"el => {{ el.value = {value}; el.dispatchEvent(new Event('input')); }}")


def open_page(context, url: str):
    """A page of `context` (a browser context of its own: a tab of a browser, each with its own
    storage) at `url`, its event stream open."""
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#status[data-state='open']", timeout=10_000)
    # Chromium opens the stream at its headers and reads its first event, the configuration, in a
    # later task: until then the controls hold the page's own defaults (delay 5, max batch 32).
    page.wait_for_function("() => S.config !== null", timeout=10_000, polling=100)
    return page


def wait_for_message(page, start: str, timeout: float = 10_000) -> str:
    """The page's message once it starts with `start`; else fail with the message it showed."""
    try:
        page.wait_for_function(
            "(s) => document.getElementById('message').textContent.startsWith(s)",
            arg=start,
            timeout=timeout,
            polling=100,
        )
    except Exception as e:
        raise AssertionError(f"message: expected one starting {start!r}, got {page.inner_text('#message')!r}") from e
    return page.inner_text("#message")


def apply_batching(page) -> None:
    page.eval_on_selector("#message", "el => { el.textContent = ''; }")
    page.click("#apply-batching")
    wait_for_message(page, "batching:")


def policy(demo) -> tuple[int, float]:
    with urllib.request.urlopen(demo.url + "api/config", timeout=10) as r:
        b = json.loads(r.read())["batching"]
    return b["max_batch_size"], b["max_queue_delay_ms"]


def test_a_tabs_sliders_follow_changes_made_elsewhere_and_its_apply_does_not_undo_them(start_demo, new_context):
    demo = start_demo("--simulate", "--rate", "50", ready=False)
    tab1, tab2 = open_page(new_context(), demo.ready().url), open_page(new_context(), demo.url)
    assert tab1.input_value("#max-batch") == "32" and tab1.input_value("#delay") == "5"

    # Another tab sets max batch 8: this tab's slider follows, and its Apply of a new delay keeps 8.
    set_range(tab2, "#max-batch", 8)
    apply_batching(tab2)
    tab1.wait_for_function("() => document.getElementById('max-batch').value === '8'", timeout=5_000, polling=100)
    set_range(tab1, "#delay", 20)
    apply_batching(tab1)
    assert policy(demo) == (8, 20)

    # A change through the API (as a script's): an untouched slider follows it, a moved one keeps
    # the user's value until Apply, which sends that one only.
    set_range(tab1, "#max-batch", 16)
    body = json.dumps({"max_queue_delay_ms": 30}).encode()
    req = urllib.request.Request(demo.url + "api/batching", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()
    tab1.wait_for_function("() => document.getElementById('delay').value === '30'", timeout=5_000, polling=100)
    assert tab1.input_value("#max-batch") == "16"
    set_range(tab2, "#delay", 40)  # after tab1's delay slider synced: tab1's Apply must not undo it
    apply_batching(tab2)
    apply_batching(tab1)
    assert policy(demo) == (16, 40)
    tab2.wait_for_function("() => document.getElementById('max-batch').value === '16'", timeout=5_000, polling=100)


CARDS = ("offered", "throughput", "p50", "p95", "p99", "errors", "queue", "mean-batch")


# The page's live texts and what the pipeline drew (its canvas's data-*).
LIVE = """() => {
    const t = (id) => document.getElementById(id).textContent;
    return {load: t('load-now'), policy: t('policy-now'), footer: t('footer').split(':')[0], state: t('state-0'),
            ...document.getElementById('pipeline').dataset};
}"""
STALE = {
    "load": "last: steady at 50 req/s",
    "policy": "last: max batch 32, delay 5.0 ms",
    "footer": "No live data",
    "state": "–",
    "stale": "true",
    "queued": "0",
    "busy": "0",
}
LIVE_AGAIN = {"load": "steady at 50 req/s", "policy": "now: max batch 32, delay 5.0 ms", "footer": "Teaching mode"}


def wait_for_live(page, expected: dict[str, str], timeout: float) -> None:
    """Wait until the page's live texts and pipeline include `expected`; else fail with what they were."""
    want = json.dumps(expected)
    try:
        page.wait_for_function(
            f"() => {{ const l = ({LIVE})(); return Object.entries({want}).every(([k, v]) => l[k] === v); }}",
            timeout=timeout,
            polling=100,
        )
    except Exception as e:
        raise AssertionError(f"page: expected {want}, got {page.evaluate(LIVE)}") from e


def port_of(demo) -> int:
    return int(demo.url.rstrip("/").rsplit(":", 1)[1])


def test_the_page_shows_nothing_as_live_once_the_demo_stops_until_it_is_back(start_demo, new_context, held_address):
    demo = start_demo("--simulate", "--rate", "50", ready=False)
    context = new_context()
    held_address.forward_to(port_of(demo.ready()))
    page = open_page(context, held_address.url())
    cards = json.dumps(CARDS)
    page.wait_for_function(
        f"() => {cards}.every((c) => document.getElementById(c).textContent !== '–')", timeout=10_000
    )
    wait_for_live(page, LIVE_AGAIN, 5_000)

    held_address.forward_to(None)  # the page's next try waits for the next demo
    assert demo.stop() == 0
    page.wait_for_selector("#status[data-state='error']", timeout=5_000)
    # The load events' period and a second (1.25 s), the queue's 1 s, the mean batch's 2 s.
    page.wait_for_function(
        f"() => {cards}.every((c) => document.getElementById(c).textContent === '–')", timeout=5_000, polling=100
    )
    # The rest no longer looks live: no queue or busy instance drawn, the texts marked "last:".
    wait_for_live(page, STALE, 5_000)

    # A demo back at the same address: the page's stream reconnects (its retry, about 3 s) and is
    # live again. The address is held by the test, not the demos' own port: between one demo's stop
    # and the next one's start, another process could take that.
    held_address.forward_to(port_of(start_demo("--simulate", "--rate", "50")))
    page.wait_for_selector("#status[data-state='open']", timeout=15_000)
    wait_for_live(page, {**LIVE_AGAIN, "stale": "false"}, 5_000)


def test_the_page_says_it_is_not_live_while_its_stream_is_up_but_no_tick_comes(start_demo, new_context):
    demo = start_demo("--simulate", "--rate", "50", ready=False)
    page = open_page(new_context(), demo.ready().url)
    wait_for_live(page, {**LIVE_AGAIN, "stale": "false"}, 5_000)

    # Stopped, the demo keeps its connections and sends nothing: the page's stream stays up with no
    # tick, as behind a live demo whose server is stopped or whose ticks are stuck.
    os.kill(demo.proc.pid, signal.SIGSTOP)
    try:
        # Four ticks' periods (1 s) without one; the load events' 1.25 s for the rate text.
        wait_for_live(page, STALE, 5_000)
        assert page.get_attribute("#status", "data-state") == "open"
        assert "the event stream is up but no tick came" in page.inner_text("#footer")
    finally:
        os.kill(demo.proc.pid, signal.SIGCONT)
    wait_for_live(page, {**LIVE_AGAIN, "stale": "false"}, 5_000)


def test_the_page_loads_without_a_console_error(start_demo, new_context):
    demo = start_demo("--simulate", "--rate", "50", ready=False)
    page = new_context().new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(demo.ready().url)
    page.wait_for_selector("#status[data-state='open']", timeout=10_000)
    # The icon is asked for once the document has loaded: wait past that, for a few load events.
    page.wait_for_function("() => document.readyState === 'complete' && S.loads.length >= 3", timeout=10_000)
    assert errors == []


def test_apply_unchanged_sends_the_window_shown_not_the_sliders_step(start_demo, new_context):
    # The delay slider steps by 0.5 ms, and a range input snaps its value to its step: a 2.3 ms
    # window, shown as 2.3, was sent as 2.5 by an Apply with no slider moved.
    demo = start_demo("--simulate", "--rate", "50", "--max-queue-delay", "2.3ms", ready=False)
    page = open_page(new_context(), demo.ready().url)
    assert page.inner_text("#delay-v") == "2.3"
    apply_batching(page)
    assert page.inner_text("#message") == "batching: max 32, delay 2.3 ms"
    assert policy(demo) == (32, 2.3)
