"""The page's controls in headless Chromium, on `wok demo --simulate` (no server to start): they
follow the configuration rather than the page's fixed limits, refuse emptied fields, and say so
when the demo is gone."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.timeout(120)


def test_the_controls_follow_the_configuration_and_refuse_what_they_cannot_send(start_demo, launch_browser):
    args = ("--simulate", "--rate", "50", "--max-queue-delay", "250ms", "--max-batch-size", "64")
    demo = start_demo(*args, ready=False)
    page = launch_browser().new_page()
    page.goto(demo.ready().url)
    page.wait_for_selector("#status[data-state='open']", timeout=10_000)

    # A 250 ms window is past the slider's 100 ms in the page: Apply unchanged must keep it.
    assert page.input_value("#delay") == "250" and page.input_value("#max-batch") == "64"
    page.click("#apply-batching")
    page.wait_for_function("() => document.getElementById('message').textContent.startsWith('batching:')")
    assert page.inner_text("#message") == "batching: max 64, delay 250 ms"

    # The arrivals the load generator could not send are shown (none here).
    page.wait_for_function("() => document.getElementById('skipped').dataset.value === '0'")

    # An emptied field is refused in the page, not sent as 0.
    page.fill("#rate", "")
    page.click("#apply-rate")
    page.wait_for_function("() => document.getElementById('message').textContent.startsWith('rate:')")
    assert page.inner_text("#message") == "rate: expected a number, got nothing"
    with urllib.request.urlopen(demo.url + "api/config", timeout=10) as r:
        assert json.loads(r.read())["load"]["rate"] == 50

    # The demo gone: the page says so instead of nothing.
    assert demo.stop() == 0
    page.fill("#rate", "80")
    page.click("#apply-rate")
    page.wait_for_function("() => document.getElementById('message').textContent.includes('did not answer')")
    page.close()
