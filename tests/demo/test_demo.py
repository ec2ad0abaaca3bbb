"""Acceptance: `wok demo` in headless Chromium. Through the page's own controls the test widens
the delay window, raises the arrival rate, slows and restores both instances, and fails one;
the page's batch size, throughput, queue and error figures must follow. With the server stopped
(SIGSTOP) the page must say its server figures are not live: stopped while the errors of the
failed instance leave the 2 s window, so that the two waits overlap. Screenshots go to the test's
tmp dir.

Each wait polls the page's figures (the load generator's 2 s window, the server's 250 ms ticks)
until they say what the change must cause, or fails with what the page showed.
"""

from __future__ import annotations

import os
import signal

import pytest

pytestmark = pytest.mark.timeout(120)


def value(page, card: str) -> float:
    v = page.get_attribute(f"#{card}", "data-value")
    return float(v) if v else float("nan")


def wait_for(page, condition: str, what: str, timeout_s: float = 12.0) -> None:
    """Wait until the page's JS `condition` holds (cards read as numbers via v('id'))."""
    # A card showing "–" (no recent events) has an empty value: NaN, which no condition holds for,
    # not Number("")'s 0, which would pass "queue <= 40" or "errors == 0" while nothing is shown.
    js = (
        "() => { const v = (id) => { const s = document.getElementById(id).dataset.value;"
        f" return s === undefined || s === '' ? NaN : Number(s); }}; return {condition}; }}"
    )
    try:
        page.wait_for_function(js, timeout=timeout_s * 1e3, polling=100)
    except Exception as exc:
        cards = {c: value(page, c) for c in ("offered", "throughput", "errors", "queue")}
        raise AssertionError(f"{what}: page shows {cards} (waited for {condition})") from exc


def set_range(page, selector: str, value: float) -> None:
    """Move a slider as a user does: set it and fire its input event."""
    page.eval_on_selector(selector, f"el => {{ el.value = {value}; el.dispatchEvent(new Event('input')); }}")


def test_the_page_follows_the_rate_a_slowdown_and_a_failed_instance(start_demo, launch_browser, tmp_path, proc_tree):
    demo = start_demo("--rate", "50", "--instances", "2", ready=False)
    page = launch_browser().new_page(viewport={"width": 1400, "height": 1000})
    page.goto(demo.ready().url)
    page.wait_for_selector("#status[data-state='open']", timeout=10_000)
    assert page.inner_text("#mode").startswith("LIVE")

    wait_for(page, "v('throughput') >= 30 && v('throughput') <= 80", "about 50 OK/s at the start")
    low = value(page, "throughput")

    # The rate and the delay window, through the page, at once: both figures cover the last 2 s,
    # so one wait for both saves one turn of that window. At 300/s a 100 ms window gathers about
    # 30 requests a batch (max 32); the 5 ms one about 2.
    page.fill("#rate", "300")
    page.click("#apply-rate")
    set_range(page, "#delay", 100)
    page.click("#apply-batching")
    wait_for(
        page,
        "v('throughput') >= 200 && v('mean-batch') >= 10",
        "throughput follows the rate to 300/s, and a 100 ms delay window makes batches of many requests",
    )
    assert "delay 100.0 ms" in page.inner_text("#policy-now")
    assert value(page, "throughput") > 3 * low
    assert value(page, "errors") == 0
    set_range(page, "#delay", 5)
    page.click("#apply-batching")
    page.wait_for_function("() => document.getElementById('policy-now').textContent.includes('delay 5.0 ms')")
    page.screenshot(path=str(tmp_path / "demo-rate.png"), full_page=True)

    # Both instances 400 ms slower per batch: at most 2 x 32 / 0.4 s = 160 samples/s, under 300/s offered.
    page.fill("#slow-ms", "400")
    page.click("#slow-0")
    page.click("#slow-1")
    wait_for(page, "v('queue') >= 100", "the queue fills while both instances are slow")
    page.screenshot(path=str(tmp_path / "demo-slow.png"), full_page=True)
    page.click("#restore-0")
    page.click("#restore-1")
    wait_for(page, "v('queue') <= 40 && v('throughput') >= 200", "the queue drains once they are restored")

    # A failed instance: about half the batches fail, so errors appear and OK throughput drops.
    page.click("#fail-0")
    wait_for(page, "v('errors') >= 50 && v('throughput') <= v('offered') - 40", "instance 0 failing shows errors")
    assert page.inner_text("#state-0") == "fail"
    page.screenshot(path=str(tmp_path / "demo-fault.png"), full_page=True)
    page.click("#restore-0")
    # Its answer: the server has lifted the fault (the errors then need the 2 s window to pass).
    page.wait_for_function("() => document.getElementById('message').textContent === 'instance 0 restored'")

    # Meanwhile, the server stopped: the page's stream stays up, the callers' load events go on, the
    # ticks stop. What comes from the ticks is marked not live; the callers' rate text stays live.
    (server,) = proc_tree.children(demo.proc.pid)
    stale = "() => document.getElementById('pipeline').dataset.stale === 'true'"
    os.kill(server, signal.SIGSTOP)
    try:
        page.wait_for_function(stale, timeout=5_000, polling=100)
        assert page.get_attribute("#status", "data-state") == "open"
        assert page.inner_text("#policy-now").startswith("last: max batch 32")
        assert page.inner_text("#load-now") == "steady at 300 req/s"
    finally:
        os.kill(server, signal.SIGCONT)
    # Live again, and no error in a window of 400 answers or more, the restore's 2 s behind it: it
    # waited out that window before the stop, which now passes within it.
    wait_for(
        page,
        "v('errors') == 0 && v('throughput') >= 200 && document.getElementById('pipeline').dataset.stale === 'false'",
        "errors stop once it is restored, and the page is live again once the server runs",
    )
    page.close()
    assert demo.stop() == 0, "\n".join(demo.log[-20:])
