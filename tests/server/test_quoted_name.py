"""`quoted_name`: how a message shows a name or id a request sent. A real name is shown as it was
before (many messages are checked exactly); a long one is cut to its start and its length, and one
with a character that is not printable is escaped, so that a wrong name can neither make a 100 KB
message nor break a client's log line. On a real server: tests/integration/test_bad_input.py."""

from __future__ import annotations

import pytest

from wok.errors import NAME_CHARS, escaped, quoted_name


@pytest.mark.parametrize("name", ["mlp", "INPUT0", "it's", 'say "hi"', "a\\b", "é日本", "emoji 😀", "x" * NAME_CHARS])
def test_a_printable_name_is_shown_as_it_is_in_single_quotes(name):
    assert quoted_name(name) == f"'{name}'"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("a\nb", "'a\\nb'"),
        ("\x1b[31mred", "'\\x1b[31mred'"),
        ("nul\x00", "'nul\\x00'"),
        ("\x7f\x85", "'\\x7f\\x85'"),  # DEL, and NEL (C1): a line break to some terminals
        ("\u202eevil", "'\\u202eevil'"),  # right-to-left override
        ("\u2028", "'\\u2028'"),  # line separator
        ("\ud800", "'\\ud800'"),  # a lone surrogate (valid in a str, not in UTF-8)
        # Once something is escaped, a backslash is too: "a\\n" and "a\n" would read alike.
        ("a\\n\n", "'a\\\\n\\n'"),
        ("it's\t", "'it's\\t'"),  # quotes are left as they are: a name is read between the outer ones
    ],
)
def test_a_name_with_a_character_that_is_not_printable_is_escaped_as_repr_escapes_it(name, shown):
    assert quoted_name(name) == shown
    assert quoted_name(name).isprintable()


def test_a_long_name_is_cut_to_its_start_and_says_its_length():
    assert quoted_name("m" * 100_000) == f"'{'m' * NAME_CHARS}'… (100,000 characters in all)"
    assert quoted_name("x" * (NAME_CHARS + 1)) == f"'{'x' * NAME_CHARS}'… ({NAME_CHARS + 1:,} characters in all)"
    # Cut, then escaped: at most 10 characters for each of the NAME_CHARS shown.
    tag = "\\U000e0001"  # a language tag, as repr escapes it
    assert quoted_name("\U000e0001" * 50_000) == "'" + tag * NAME_CHARS + "'… (50,000 characters in all)"


def test_escaped_is_the_start_of_an_escaped_name_as_shown():
    # bench/fuzz.py's judge looks for it in the details of the answer to a wrong name.
    name = "\x00%é\n" * 100
    assert quoted_name(name).startswith("'" + escaped(name[:32]))
    assert escaped("plain") == "plain"
