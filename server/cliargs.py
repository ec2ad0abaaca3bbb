"""argparse's refusals in wok's words: the base of `wok`'s parser (server/__main__.py) and of the
parsers of bench/'s standalone scripts.

argparse shows a value it refuses (a bad int, a choice not offered) as repr writes it, whole: a
100,000-character value made a 100 KB refusal. Here it is shown as user text is everywhere
(errors.quoted_name: quoted, escaped, cut), and every refusal is one line (`one_line`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .errors import MESSAGE_CHARS, cut_middle, printable, quoted_name, shown_value
from .numerals import digits_note, read_float, read_int

# What a cut refusal keeps of its end: its reason. A message that long is long for a path (or a word)
# shown as given in its middle; "--json PATH: File name too long" cut at its start lost the reason.
TAIL_CHARS = 1024


def one_line(message: str) -> str:
    """A refusal's message as a command prints it: one line of at most MESSAGE_CHARS characters.
    The user's text it holds is quoted where the message is made (errors.quoted_name); a path, or a
    word argparse shows as given (an unrecognized argument of a script, an ambiguous option), is
    not, and its newline would split the line, its terminal escape reach the terminal, its 100,000
    characters make the message: what is not printable is escaped here as repr escapes it
    (backslashes left as they are), and a message still too long is cut in its middle, where such
    a path is, keeping its start (the option) and its last TAIL_CHARS characters (the reason, the
    OS's "File name too long" among them): 'head… (100,025 characters in all) …tail'."""
    return cut_middle(printable(message), MESSAGE_CHARS, TAIL_CHARS)


def _integer(text: str) -> int:
    try:
        return read_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer; got {quoted_name(text)}{digits_note(text)}") from None


def _number(text: str) -> float:
    try:
        return read_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {quoted_name(text)}{digits_note(text)}") from None


def _path(text: str) -> Path:
    # Path("") is ".": `--json ""` (a variable left empty) was refused as "--json .: is a folder",
    # `--plots ""` wrote into the working directory, `--model-repository ""` served it.
    if not text:
        raise argparse.ArgumentTypeError("expected a path; got ''")
    return Path(text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, its refusals in wok's words: type=int, type=float and type=Path values as
    "expected an integer; got 'abc'" (not "invalid int value: 'abc'"), numbers in ASCII alone (int()
    took "٣" for 3: wok.numerals), a choice not offered quoted as user text is, an empty path
    refused, and every message one line (`one_line`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", int, _integer)
        self.register("type", float, _number)
        self.register("type", Path, _path)

    def _get_value(self, action, arg_string):
        # argparse's, but for the value shown: a type function's ValueError was "invalid parse_duration
        # value: " and the value as repr writes it, whole.
        type_func = self._registry_get("type", action.type, action.type)
        if not callable(type_func):
            return super()._get_value(action, arg_string)  # argparse's own refusal of the parser
        try:
            return type_func(arg_string)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(action, str(exc)) from None
        except (TypeError, ValueError):
            name = getattr(action.type, "__name__", repr(action.type))
            raise argparse.ArgumentError(action, f"invalid {name} value: {shown_value(arg_string)}") from None

    def _check_value(self, action, value) -> None:
        # argparse's own shows the value as repr does: whole, however long.
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {shown_value(value)} (choose from {choices})")

    def error(self, message: str):
        super().error(one_line(message))
