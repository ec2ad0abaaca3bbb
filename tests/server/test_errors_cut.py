"""`cut_message`: a model's message in a log line and in an /events batch event, bounded by the bytes
it takes there, and cut as every value wok cuts is (errors.CUT_NOTE). The event on a real server:
tests/server/test_admin_events.py; the log line: tests/server/test_forward_base_exceptions.py."""

from __future__ import annotations

import json

import pytest

from wok import errors
from wok.admin import dumps
from wok.cliargs import TAIL_CHARS, one_line
from wok.errors import CUT_NOTE, MESSAGE_CHARS, NOTE_BYTES, cut_message, cut_middle, quoted_name

MESSAGE_BYTES = 4096  # errors.MESSAGE_BYTES, as docs/demo.md gives it: the bound an event's error is held to


@pytest.mark.parametrize(
    "char",
    ["é", "日", "\U0001f600", "\x1b", '"', "\\", "\n"],
    ids=["latin-1", "cjk", "astral", "escape", "quote", "backslash", "newline"],
)
def test_a_message_is_cut_to_its_size_as_an_event_encodes_it(char):
    """4,096 characters that are not ASCII made 24 KB of JSON \\u escapes in an event (48 KB beyond the
    Basic Multilingual Plane), for a bound meant as 4 KB; and the note came on top of the bound."""
    message = "model 'm' failed: ValueError: " + char * 10_000
    cut = cut_message(message)
    assert len(dumps({"error": cut})) == len(dumps({"error": ""})) + json_bytes(cut)
    assert json_bytes(cut) <= MESSAGE_BYTES, json_bytes(cut)  # the note included
    assert len(cut.encode()) <= MESSAGE_BYTES  # the log line's UTF-8 too
    start, _, note = cut.rpartition("… (")
    assert message.startswith(start)
    # And no shorter than it need be: one character more would not fit beside the note.
    assert json_bytes(message[: len(start) + 1] + cut[len(start) :]) > MESSAGE_BYTES
    assert note == f"{len(message):,} characters in all)"
    assert errors.MESSAGE_BYTES == MESSAGE_BYTES


def test_a_message_that_fits_is_whole_and_one_that_does_not_is_cut_to_its_size_note_and_all():
    assert cut_message("é" * 682) == "é" * 682  # 4,092 bytes as \u00e9
    assert cut_message("x" * MESSAGE_BYTES) == "x" * MESSAGE_BYTES
    # The note, "… (5,000 characters in all)", is 32 bytes as JSON writes it (the ellipsis \u2026).
    assert cut_message("x" * (MESSAGE_BYTES + 1)) == "x" * (MESSAGE_BYTES - 32) + "… (4,097 characters in all)"
    assert cut_message("x" * 5000) == "x" * (MESSAGE_BYTES - 32) + "… (5,000 characters in all)"
    assert cut_message("x" * 300, 200) == "x" * (200 - 30) + "… (300 characters in all)"
    assert cut_message("é" * 683) == "é" * 677 + "… (683 characters in all)"  # 4,062 + 30 bytes


def json_bytes(text: str) -> int:
    """The bytes `text` takes in a JSON string as admin.dumps writes it (ASCII), quotes left out."""
    return len(json.dumps(text)) - 2


@pytest.mark.parametrize("size", [64, 100, 200, 201, MESSAGE_BYTES])
@pytest.mark.parametrize("fill", ["x", "é", "\U0001f600", 'a"', "ab\n", "日x"], ids=repr)
def test_a_cut_message_takes_at_most_its_size_at_every_length_past_it(size, fill):
    """At the boundary: each length from the last that fits whole to 20 characters past it, and one
    whose note is longer, in ASCII, in 6- and 12-byte characters and in 2-byte escapes."""
    whole = fill * (size + 20)
    fits = max(n for n in range(len(whole) + 1) if json_bytes(whole[:n]) <= size)
    for message in [whole[:n] for n in range(fits, fits + 21)] + [fill * 600_000]:
        cut = cut_message(message, size)
        assert json_bytes(cut) <= size, (len(message), cut)
        if json_bytes(message) <= size:
            assert cut == message
            continue
        note = f"… ({len(message):,} characters in all)"
        assert cut.endswith(note) and message.startswith(cut.removesuffix(note))
        start = len(cut) - len(note)
        assert json_bytes(message[: start + 1] + note) > size, (len(message), cut)  # no shorter than need be


def test_a_size_that_cannot_hold_the_longest_note_is_refused():
    # "… (9,223,372,036,854,775,807 characters in all)": 52 bytes, the longest note a str's length makes.
    assert errors.NOTE_BYTES == 52
    assert cut_message("x" * 100, errors.NOTE_BYTES) == "x" * (52 - 30) + "… (100 characters in all)"
    with pytest.raises(ValueError, match="size: expected at least 52 bytes, the longest note's; got 51"):
        cut_message("x", 51)


def test_every_cut_ends_alike():
    """Three styles for one cut: `'…'... (N bytes in all)` (the HTTP ports), `'…'… (N characters in
    all)` (a name), `…… (cut: N characters in all)` (a message)."""
    assert cut_message("m" * 300, 200).lstrip("m") == quoted_name("m" * 300).removeprefix(f"'{'m' * 200}'")


@pytest.mark.parametrize(
    "char", ["é", "日", "\U0001f600", '"', "\\"], ids=["latin-1", "cjk", "astral", "quote", "backslash"]
)
@pytest.mark.parametrize(("size", "tail"), [(MESSAGE_CHARS, TAIL_CHARS), (1_700, 850), (256, 128)])
def test_cut_middle_keeps_as_much_of_a_texts_start_as_an_ascii_one_in_characters(char, size, tail):
    """cut_middle's bound is characters on a line (one_line's MESSAGE_CHARS, a warm-up refusal's config path): its
    start was measured in JSON bytes (cut_message), 6 a character for 'é', its end in characters, so that a path not
    ASCII kept a sixth as much of its start as of its end. Now the start of one is cut where an ASCII one's is."""
    text = "".join(f"{char}{i % 10}" for i in range(5_000))  # digits between: where each end comes from shows
    ascii_twin = text.replace(char, "x")
    line = cut_middle(text, size, tail)
    assert line == cut_middle(ascii_twin, size, tail).replace("x", char)
    assert len(line) <= size
    head, cut, end = line.partition(CUT_NOTE.format(len(text)) + " …")
    assert cut and text.startswith(head) and text.endswith(end), line
    # As many characters as the bound leaves: the note is given its room as JSON, 5 more (its ellipsis as \u2026).
    assert len(end) == tail and len(head) == size - tail - len(cut) - 5, (len(head), len(end))


def test_one_line_of_a_path_not_ascii_keeps_its_start_and_its_reason_within_its_bound():
    message = "--json /tmp/" + "日" * 5_000 + ".json: File name too long"
    line = one_line(message)
    assert len(line) <= MESSAGE_CHARS
    head, cut, end = line.partition(CUT_NOTE.format(len(message)) + " …")
    assert cut and message.startswith(head) and end == message[-TAIL_CHARS:], line
    assert len(head) > 2_900, len(head)  # 516 before: its 日 counted 6 each


def test_cut_middle_refuses_a_size_with_no_room_for_its_note_and_keeps_no_end_for_a_tail_of_0():
    with pytest.raises(ValueError, match=rf"size - tail - 2: expected at least {NOTE_BYTES}, .*; got {NOTE_BYTES - 1}"):
        cut_middle("x", NOTE_BYTES + 1 + 100, 100)
    # text[-0:] is all of it: a tail of 0 made the "cut" text longer than the text.
    assert cut_middle("x" * 1_000, 200, 0) == "x" * (200 - 2 - 32) + "… (1,000 characters in all) …"  # 32: 27 + 5
