"""Numbers in text a user wrote, read in ASCII alone (server/numerals.py): int(), float() and
Decimal() read every script's digits and spaces ("٣" is 3), where a refusal was due."""

from __future__ import annotations

from decimal import Decimal

import pytest

from wok.numerals import ascii_digits, digits_note, read_decimal, read_float, read_int

# Each read as 3 (or 3.5) by int()/float()/Decimal(): Arabic-Indic, fullwidth, Devanagari digits.
NOT_ASCII = ["٣", "３", "३", "-٣", "1_٠٠٠"]
NOT_ASCII_FLOATS = ["٣.٥", "３.５", "٣e٢"]
# Each read as 3 (or 3.5) too: a no-break space, an em space or a line separator around ASCII digits.
OTHER_SPACES = ["\u00a03", "3\u2003", "\u00a03.5", "3\u2028", "\u00853"]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_an_integer_in_other_digits_is_refused(text):
    with pytest.raises(ValueError, match="expected an integer in the digits 0-9; got "):
        read_int(text)


@pytest.mark.parametrize("text", NOT_ASCII + NOT_ASCII_FLOATS)
def test_a_number_in_other_digits_is_refused(text):
    with pytest.raises(ValueError, match="expected a number in the digits 0-9; got "):
        read_float(text)
    with pytest.raises(ValueError, match="expected a number in the digits 0-9; got "):
        read_decimal(text)


@pytest.mark.parametrize("text", OTHER_SPACES, ids=ascii)
def test_a_number_with_other_white_space_around_it_is_refused_showing_it(text):
    """ASCII's white space alone (numerals.SPACES) is trimmed: "\u00a03" was 3 (int() strips every Unicode
    space), where the refusal of the same text in any other field names the character."""
    for read, kind in ((read_int, "an integer"), (read_float, "a number"), (read_decimal, "a number")):
        if read is read_int and "." in text:
            continue
        with pytest.raises(ValueError) as info:
            read(text)
        assert (
            str(info.value)
            == f"expected {kind} with no white space around it but spaces, tabs and line ends; got {text!r}"
        )


@pytest.mark.parametrize(
    ("text", "number"),
    [("3", 3), (" -3 ", -3), ("\t3\t", 3), ("3\r\n", 3), (" 3\x0b", 3), ("+3", 3), ("007", 7)],
    ids=repr,
)
def test_ascii_integers_read_as_int_reads_them(text, number):
    assert read_int(text) == number


@pytest.mark.parametrize(("text", "number"), [("3.5", 3.5), (" -.5 ", -0.5), ("1e3", 1000.0), ("inf", float("inf"))])
def test_ascii_numbers_read_as_float_reads_them(text, number):
    assert read_float(text) == number


@pytest.mark.parametrize("text", ["1_000", "1_5", "-1_000", "1_000.5", "1e1_0"])
def test_an_underscore_between_digits_is_refused(text):
    """int(), float() and Decimal() take '_' between digits as Python's literals do: "1_000" was 1000 to `--port`
    and `--peak-qps`, and a '_' typed for a '.' ("1_5") 15, where durations, sizes and rates refused it."""
    for read, kind in ((read_int, "an integer"), (read_float, "a number"), (read_decimal, "a number")):
        with pytest.raises(ValueError) as info:
            read(text)
        assert str(info.value) == f"expected {kind} without '_'; got {text!r}"
    assert digits_note(text) == " (numbers are read without '_': 1000, not 1_000)"


def test_a_decimal_is_exact_and_its_refusal_a_value_error():
    assert read_decimal(" 0.1 ") == Decimal("0.1")
    with pytest.raises(ValueError, match="expected a number; got 'abc'"):
        read_decimal("abc")


@pytest.mark.parametrize(("text", "whole"), [("12", True), ("٣", False), ("²", False), ("", False), ("-1", False)])
def test_ascii_digits(text, whole):
    assert ascii_digits(text) is whole


def test_the_note_is_for_text_that_is_not_ascii():
    assert digits_note("abc") == digits_note("a_b") == digits_note("_1") == ""
    assert digits_note("٣") == " (numbers are read in ASCII: the digits 0-9)"
