"""server/cliargs.py: refusals in one bounded line, and the argparse internals its parser overrides."""

from __future__ import annotations

import argparse
import inspect

import pytest

from wok.cliargs import TAIL_CHARS, ArgumentParser, one_line
from wok.errors import MESSAGE_CHARS


def test_a_message_too_long_is_cut_in_its_middle_keeping_its_start_and_its_reason():
    """Cut at its end, "--json PATH: File name too long" lost the reason to a path of 5,000 characters."""
    message = "--json /tmp/" + "p" * 5000 + "\n.json: File name too long"
    line = one_line(message)
    note = f"… ({len(message) + 1:,} characters in all)"  # 32 bytes as JSON writes it
    head = message[: MESSAGE_CHARS - TAIL_CHARS - 2 - 32]
    tail = message.replace("\n", "\\n")[-TAIL_CHARS:]
    assert line == f"{head}{note} …{tail}"
    assert line.endswith("p\\n.json: File name too long") and "\n" not in line
    assert len(line) <= MESSAGE_CHARS  # the cut's note included
    assert one_line("x" * MESSAGE_CHARS) == "x" * MESSAGE_CHARS  # as long as it may be: whole


# cliargs.ArgumentParser overrides two methods argparse does not document, _get_value and
# _check_value, for the value its refusals show (argparse's repr, whole; see the module). No public
# way does it alike: `type=` callables raising ArgumentTypeError would take a wrapper around every
# type (argument groups add theirs past the parser's add_argument) and still leave a choice refused
# in argparse's words, the subcommand's among them; parse_known_args comes after them. So the
# overrides stay, and these tests fail loudly if argparse renames, re-signs or stops calling them.
PRIVATE = {
    "_get_value": ["self", "action", "arg_string"],
    "_check_value": ["self", "action", "value"],
    "_registry_get": ["self", "registry_name", "value", "default"],
}


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_the_argparse_internals_overridden_keep_their_signature(name):
    method = getattr(argparse.ArgumentParser, name, None)
    assert method is not None, f"argparse.ArgumentParser.{name} is gone: server/cliargs.py must follow"
    assert list(inspect.signature(method).parameters)[: len(PRIVATE[name])] == PRIVATE[name], name


LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"


def _duration(text: str) -> float:
    raise ValueError(f"not a duration: {text}")


@pytest.mark.parametrize(
    ("add", "refusal"),
    [
        ({"type": int}, f"argument --x: expected an integer; got {LONG_SHOWN}"),
        ({"type": _duration}, f"argument --x: invalid _duration value: {LONG_SHOWN}"),
        ({"choices": ("a", "b")}, f"argument --x: invalid choice: {LONG_SHOWN} (choose from 'a', 'b')"),
    ],
    ids=["registered-type", "type-raising-value-error", "choice"],
)
def test_argparse_still_calls_the_overrides(add, refusal):
    """Were argparse to stop calling them, its own words would come back: 'invalid int value',
    the value as repr writes it, whole."""
    parser = ArgumentParser(prog="t", exit_on_error=False)
    group = parser.add_argument_group("g")  # a group's options too: they share the parser's
    group.add_argument("--x", **add)
    with pytest.raises(argparse.ArgumentError) as info:
        parser.parse_args(["--x", LONG])
    assert str(info.value) == refusal
