"""`cut_message`: a model's message in a log line and in an /events batch event, bounded by the bytes
it takes there, and cut as every value wok cuts is (errors.CUT_NOTE). The event on a real server:
tests/server/test_admin_events.py; the log line: tests/server/test_forward_base_exceptions.py."""

from __future__ import annotations

import json

import pytest

from wok import errors
from wok.admin import dumps
from wok.errors import cut_message, quoted_name

MESSAGE_BYTES = 4096  # errors.MESSAGE_BYTES, as docs/demo.md gives it: the bound an event's error is held to


@pytest.mark.parametrize(
    "char",
    ["é", "日", "\U0001f600", "\x1b", '"', "\\", "\n"],
    ids=["latin-1", "cjk", "astral", "escape", "quote", "backslash", "newline"],
)
def test_a_message_is_cut_to_its_size_as_an_event_encodes_it(char):
    """4,096 characters that are not ASCII made 24 KB of \\uXXXX in an event (48 KB beyond the
    Basic Multilingual Plane), for a bound meant as 4 KB."""
    message = "model 'm' failed: ValueError: " + char * 10_000
    cut = cut_message(message)
    assert len(dumps({"error": cut})) < MESSAGE_BYTES + 100, len(dumps({"error": cut}))
    assert len(cut.encode()) <= MESSAGE_BYTES + 100  # the log line's UTF-8 too
    start, _, note = cut.rpartition("… (")
    assert message.startswith(start)
    assert len(json.dumps(start)) - 2 <= MESSAGE_BYTES  # the start, as the event's JSON writes it
    # And no shorter than it need be: one character more would not fit.
    assert len(json.dumps(message[: len(start) + 1])) - 2 > MESSAGE_BYTES
    assert note == f"{len(message):,} characters in all)"
    assert errors.MESSAGE_BYTES == MESSAGE_BYTES


def test_a_message_that_fits_is_whole_and_ascii_is_cut_at_its_size():
    assert cut_message("é" * 682) == "é" * 682  # 4,092 bytes as \u00e9
    assert cut_message("x" * MESSAGE_BYTES) == "x" * MESSAGE_BYTES
    assert cut_message("x" * 5000) == "x" * MESSAGE_BYTES + "… (5,000 characters in all)"
    assert cut_message("x" * 300, 200) == "x" * 200 + "… (300 characters in all)"


def test_every_cut_ends_alike():
    """Three styles for one cut: `'…'... (N bytes in all)` (the HTTP ports), `'…'… (N characters in
    all)` (a name), `…… (cut: N characters in all)` (a message)."""
    assert cut_message("m" * 300, 200).removeprefix("m" * 200) == quoted_name("m" * 300).removeprefix(f"'{'m' * 200}'")
