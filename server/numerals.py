"""Numbers in text a user wrote (an option, a spec's field, a trace file's cell), read in ASCII alone.

Python's int(), float() and Decimal() read every script's digits and spaces: int("٣") is 3,
float("３.５") is 3.5, int("\\u00a03") is 3, so `--steps ٣,٤` ramped at 3 and 4 QPS where a
refusal was due. Here such text is refused; ASCII text is read as int() and float() read it
(a sign, float's "1e3" and "inf"), which is what wok's options took before, with ASCII white
space (SPACES) around it and no other: a parser that trims a number's text trims SPACES alone,
as str.strip() would drop a no-break space unseen. But for a '_' between digits, which the three
take as Python's literals do: "1_000" was 1000 to `--port` and `--peak-qps`, a '_' typed for a '.'
("1_5") 15, where the bench's durations, sizes and rates (regular expressions of [0-9]) refused it.
Standard library alone, unlike wok.errors (gRPC): the bench's worker processes and its outputs import it."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# What a refusal of a number adds when its text is not ASCII: its writer reads "٣" as a digit.
NOT_ASCII_NOTE = " (numbers are read in ASCII: the digits 0-9)"
# ... and when it has a '_' between digits, which Python's int() and float() would have read.
UNDERSCORE_NOTE = " (numbers are read without '_': 1000, not 1_000)"
_DIGITS_APART = re.compile(r"[0-9]_[0-9]")
# The white space a number's text may have around it: ASCII's, as int() and float() take it, line
# ends included (a value from `$(cat file)` of a CRLF file ends in "\r", a Kubernetes ConfigMap's made
# --from-file in "\n"). str.strip(), int() and float() take every Unicode space as well ("\xa0",
# "\u2003"): text a user sees as a space, or does not see at all, was read as if it were not there.
SPACES = " \t\n\r\f\v"


def ascii_digits(text: str) -> bool:
    """Whether `text` is one or more of the digits 0-9 and nothing else: a whole number as int() reads it.
    Not str.isdigit() alone: it also takes "²", which int() refuses (a bare ValueError where a refusal
    naming the input was due), and "٣", which int() reads as 3."""
    return text.isascii() and text.isdigit()


def digits_note(text: str) -> str:
    """NOT_ASCII_NOTE where `text` is not ASCII, UNDERSCORE_NOTE where it has a '_' between digits, else "": for
    a refusal that quotes `text`, a number alone."""
    if not text.isascii():
        return NOT_ASCII_NOTE
    return underscore_note(text)


def underscore_note(text: str) -> str:
    """UNDERSCORE_NOTE where `text` has a '_' between ASCII digits, else "": for a refusal that quotes `text` where
    more than a number may stand (a unit, a '%', an ISO 8601 time), so that its other characters need not be
    digits (a timestamp's line separator is not a digit of another script)."""
    return UNDERSCORE_NOTE if _DIGITS_APART.search(text) else ""


def _ascii(text: str, kind: str) -> str:
    bare = text.strip(SPACES)
    if bare != bare.strip():
        raise ValueError(f"expected {kind} with no white space around it but spaces, tabs and line ends; got {text!r}")
    if not text.isascii():
        raise ValueError(f"expected {kind} in the digits 0-9; got {text!r}")
    if "_" in text:
        raise ValueError(f"expected {kind} without '_'; got {text!r}")
    return text


def read_int(text: str) -> int:
    """int(text) for ASCII text with no '_' and nothing but SPACES around it; ValueError for any other, as for
    text int() refuses."""
    return int(_ascii(text, "an integer"))


def read_float(text: str) -> float:
    """float(text) for ASCII text with no '_' and nothing but SPACES around it; ValueError for any other, as
    for text float() refuses."""
    return float(_ascii(text, "a number"))


def read_decimal(text: str) -> Decimal:
    """Decimal(text) for ASCII text with no '_' and nothing but SPACES around it; ValueError for any other, and for
    text Decimal refuses (whose own refusal, InvalidOperation, is an ArithmeticError)."""
    try:
        return Decimal(_ascii(text, "a number"))
    except InvalidOperation:
        raise ValueError(f"expected a number; got {text!r}") from None
