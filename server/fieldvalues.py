"""HTTP field values as RFC 9110 5.6 reads them: lists and parameters split outside quoted strings,
and a quoted string's text. One reading for every field wok parses (Accept, Transfer-Encoding,
Connection on the HTTP ports; Server-Timing in the bench's workers). Free of wok's other modules
and of anything outside the standard library: the bench's worker processes import it
(through servertiming).
"""

from __future__ import annotations

import re

# Optional white space around and inside a field value (OWS, RFC 9110 5.6.3): spaces and tabs, no other.
# str.strip() and str.split() without arguments take every Unicode space and the C0 separators \x1c-\x1f
# as well: "application/json\xa0" read as application/json.
OWS = " \t"


def split_unquoted(value: str, separator: str) -> list[str]:
    """`value` split at each `separator` (a list's comma, a parameter's semicolon) outside a quoted
    string: in one, with its backslash escapes, it is text (RFC 9110 5.6.1, 5.6.4, 5.6.6). A quote
    left open runs to the end, for the caller to refuse or skip what it is part of."""
    if '"' not in value:
        # No quoted string, so every separator separates. The bench's workers split each answer's
        # server-timing trailer (~190 characters) here: char by char it cost ~15 µs an answer more.
        return value.split(separator)
    parts = []
    start = 0
    in_quotes = escaped = False
    for i, char in enumerate(value):
        if escaped:
            escaped = False
        elif in_quotes:
            escaped = char == "\\"
            in_quotes = char != '"'
        elif char == '"':
            in_quotes = True
        elif char == separator:
            parts.append(value[start:i])
            start = i + 1
    parts.append(value[start:])
    return parts


def unquoted(value: str) -> str:
    """A parameter's value as its token or quoted string means it (RFC 9110 5.6.6: the two forms are
    equivalent), the quotes and backslash escapes of the latter removed."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value
