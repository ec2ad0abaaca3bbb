"""wok's exceptions and the one place that maps them to gRPC status codes.

Library code raises these; the service turns them into a status with `to_status`, and the
streaming RPC into an `error_message`. Messages name the input, what was expected and
what was got, because that is what a user needs to fix a request.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping

import grpc


class WokError(Exception):
    """Base of the errors a request can end with; `code` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ModelNotFound(WokError):
    code = grpc.StatusCode.NOT_FOUND


class InvalidVersion(ModelNotFound):
    """A model version that is no integer of 0 to 2**63-1: INVALID_ARGUMENT, as Triton answers a version its
    int64 parse refuses. A ModelNotFound still, as the request names no model served and is counted so."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidInput(WokError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class QueueFull(WokError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineUnmeetable(WokError):
    """Refused at arrival: even run as soon as the queue ahead of it allows, it would miss its deadline.

    `retry_after_s` is by how much it would miss: the time the queue ahead needs to drain that far.
    `retry_after_ms` is the hint clients get, in whole ms, at least 1: the message ends with it
    ("; retry after N ms", the only hint on a stream) and a unary call's `retry-after-ms` trailer
    carries it, so the two never disagree.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float) -> None:
        """`message` without the hint: "; retry after N ms" is added here."""
        # Rounded to a µs first: a miss of exactly 3 ms computed as 3.0000000000000004 ms is 3 ms.
        self.retry_after_ms = max(1, math.ceil(round(1e3 * retry_after_s, 3)))
        super().__init__(f"{message}; retry after {self.retry_after_ms} ms")
        self.retry_after_s = retry_after_s


class AnswerTooLarge(WokError):
    """The answer to a request is larger than the server may send (gRPC's send limit); the batch
    it came from and the other requests on its stream are unaffected."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(WokError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class ShuttingDown(WokError):
    code = grpc.StatusCode.UNAVAILABLE


class NotStarted(WokError):
    """The server's start has not finished (its ports open before its health says SERVING)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeviceLost(WokError):
    """A CUDA device's context is unusable after a device-side error (a kernel's assert, an illegal
    address): every later batch there would fail, and only a new process recovers it. The model
    refuses requests (UNAVAILABLE, to be retried elsewhere) and the server's health turns
    NOT_SERVING, so that a balancer routes around it and an orchestrator restarts it."""

    code = grpc.StatusCode.UNAVAILABLE


class DeviceLostRefusal(DeviceLost):
    """A request refused at arrival because its model's device was lost before it came (the batcher's
    check_room): counted as rejected (`model_failed`), unlike the requests whose batch the loss failed."""


class NotSupported(WokError):
    """A protocol call wok declares only to say why it does not serve it (loading a model at run time)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class RegionNotFound(WokError):
    """A shared-memory region asked for by name: wok never holds one (Triton's NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class ModelExecutionError(WokError):
    """The model raised while running a batch (or answered wrongly); the requests of that batch
    that fail alone too, when it is rerun in parts (executor's Instance._isolate), end with it."""

    code = grpc.StatusCode.INTERNAL


class BatcherFailed(ModelExecutionError):
    """A request refused at arrival because its model's batching task failed (the batcher's check_room):
    the model refuses every request until the server restarts; counted as rejected (`model_failed`)."""


class CheckFailed(WokError):
    """A Servable's own check, or its batch_key, failed itself: it raised what is no WokError (a refusal is
    InvalidInput). Its caller is answered as for any exception no WokError ends a request with (to_status: INTERNAL,
    "internal error: ValueError: ..."), but the servable has logged it, rate-limited (servable.CheckFailureLog): the
    handler, which logs such an exception itself, leaves it. Raised from the hook's exception."""

    def __init__(self, exc: BaseException) -> None:
        code, details = to_status(exc)
        super().__init__(details)
        self.code = code


class WarmupError(ModelExecutionError):
    """The model failed its start-up warm-up: its config (or the model) must change, so `wok serve`
    exits as for any other config error. `device_lost`: the failure was a device-side error that
    left the device unusable (executor's Instance.lost), so the process must not free its memory
    at exit (`wok serve` leaves through os._exit)."""

    def __init__(self, message: str, device_lost: DeviceLost | None = None) -> None:
        super().__init__(message)
        self.device_lost = device_lost


# The line of a TorchScript interpreter's error that names the error: "RuntimeError: ...", or "builtins.ValueError: ..."
# for an exception the script raised itself.
_NAMED_LINE = re.compile(r"(?:builtins\.)?([A-Za-z_][\w.]*(?:Error|Exception)): (.*)")
_SCRIPT_TRACEBACK = "Traceback of TorchScript"


def script_error(text: str) -> tuple[str, str] | None:
    """(type's name, message) of the error that a TorchScript interpreter's message reports; None for any other.

    The interpreter (torch/csrc/jit/runtime/interpreter.cpp, handleError) raises a RuntimeError of its own for an
    op's error, torch's code (AcceleratorError.error_code) and type lost: its traceback of the script, then
    "Type: message" at a line's start, the message as the op's error gave it, which may go on for lines (CUDA's
    advice after "CUDA error: ..."; a Python op's error's own "At: ..." traceback). The script's source lines in
    the traceback are indented (a function's body, serialized code), so the first line not indented that names
    an error is it. A Python op's error is named twice ("RuntimeError: AcceleratorError: CUDA error: ..."): the
    innermost is given."""
    if _SCRIPT_TRACEBACK not in text:
        return None
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if _SCRIPT_TRACEBACK in line)
    for i in range(start + 1, len(lines)):
        named = _NAMED_LINE.fullmatch(lines[i])
        if named is None:
            continue
        name, first = named[1], named[2]
        while (inner := _NAMED_LINE.fullmatch(first)) is not None:
            name, first = inner[1], inner[2]
        return name.rpartition(".")[2], "\n".join([first, *lines[i + 1 :]])
    return None


def message_of(exc: BaseException) -> str:
    """str(exc), as a plain str, without ever raising.

    A model's exception (or its check's) is the user's code: its __str__ may raise, return what is
    not a str, or format an argument whose repr raises, and it may be a BaseException. Described
    with plain str(), the error path itself raised in its place: a batch's error never reached its
    callers (unanswered until their deadlines), and a check's failure was reported as wok's own.
    What __str__ raised is named in its place. Read once: a slow __str__ is paid once."""
    try:
        text = str(exc)
    except BaseException as failed:  # whatever __str__ does, the description is made
        try:
            why = f"{type(failed).__name__}: {failed!s}"
        except BaseException:
            why = type(failed).__name__
        return f"(its message cannot be shown: str() raised {why})"
    # A str subclass (__str__ may return one) could override what is done with the text next.
    return text if type(text) is str else str.__str__(text)


def error_line(exc: BaseException) -> str:
    """'Type: message' in one line, for a client: the full message (TorchScript's traceback, CUDA's
    advice) belongs in the server's log. Never raises (`message_of`).

    A TorchScript error's message is the script's traceback, then the error itself (script_error), whose first
    line is given as the error names it there ("RuntimeError: index out of range in self", not under a second
    "RuntimeError: "); it gave the message's last line, CUDA's advice for a CUDA error ("Compile with
    `TORCH_USE_CUDA_DSA` ..."). Any other message gives its first line.
    """
    name = type(exc).__name__
    text = message_of(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return f"{name}: (no message)"
    if _SCRIPT_TRACEBACK not in text:
        return f"{name}: {lines[0]}"
    embedded = script_error(text)
    if embedded is not None:
        first = embedded[1].partition("\n")[0].strip()
        return f"{embedded[0]}: {first or '(no message)'}"
    return f"{name}: {lines[-1]}"


# A model's error message is shown in a line of the server's log (batcher's FailureLog) and in an
# /events batch event (admin.py) up to this many bytes, encoded (`encoded_size`), the note of a cut one
# included, as a client's details are cut (`short_details` in service.py): a model's message of 20 MB made
# a 20 MB log line, and an event as long; and counted in characters, 4,096 characters that are not ASCII
# made 24 KB of JSON \u escapes (6 bytes a character) in an event.
MESSAGE_BYTES = 4096
# The bound in characters that MESSAGE_BYTES implies (each character is at least a byte), by the name
# its callers import (cliargs' one_line, batcher's FailureLog).
MESSAGE_CHARS = MESSAGE_BYTES

# How every cut value ends, in every message wok writes: its start (in quotes when the value is quoted),
# an ellipsis, and its whole length in characters: 'mmm'… (100,000 characters in all).
CUT_NOTE = "… ({:,} characters in all)"


def encoded_size(char: str) -> int:
    """The bytes one character takes as JSON writes it in ASCII (admin.dumps, json.dumps' default): 1
    for printable ASCII, 2 for `"`, a backslash and \\n-like escapes, 6 for another control character
    or one of the Basic Multilingual Plane (\\u00e9), 12 for one beyond it (a surrogate pair). Never
    less than its UTF-8 size, so a bound in it holds for a log line too."""
    if " " <= char <= "~":
        return 2 if char in '"\\' else 1
    if char in "\b\f\n\r\t":
        return 2
    return 6 if char < "\U00010000" else 12


def _note_bytes(length: int) -> int:
    return len(CUT_NOTE.format(length)) + 5  # all ASCII but the ellipsis, 6 bytes as \u2026


# The most bytes a cut's note takes (`encoded_size`): for the longest str Python can hold. The least size
# `cut_message` takes, so that its bound holds for every message.
NOTE_BYTES = _note_bytes(sys.maxsize)


def cut_at(message: str, end: int) -> str:
    """`message` whole when `end` reaches its end, else its first `end` characters and its length
    (CUT_NOTE), the note past `end`: for a caller that counted where to cut by its own measure, leaving
    room for the note (service's short_details)."""
    if len(message) <= end:
        return message
    return message[:end] + CUT_NOTE.format(len(message))


def cut_message(message: str, size: int = MESSAGE_BYTES) -> str:
    """`message` whole when it takes at most `size` bytes encoded (`encoded_size`), else its longest
    start that takes at most `size` bytes with its length after it: 'yyy… (3,000,032 characters in all)'
    (CUT_NOTE), note included. `size` is at least NOTE_BYTES (ValueError)."""
    if size < NOTE_BYTES:
        raise ValueError(f"size: expected at least {NOTE_BYTES} bytes, the longest note's; got {size}")
    start = message[:size]  # at least a byte a character: no more can fit
    if start.isascii() and start.isprintable() and '"' not in start and "\\" not in start:
        # A byte each: the usual case, no count.
        return message if len(message) <= size else cut_at(message, size - _note_bytes(len(message)))
    room = size - _note_bytes(len(message))
    used = 0
    end = None  # the longest start that fits beside the note, once the message is known not to fit whole
    for i, char in enumerate(start):
        used += encoded_size(char)
        if end is None and used > room:
            end = i
        if used > size:
            return cut_at(message, end)
    # Each character fitted: whole when that was all of it; else the start took a byte each, past room.
    return message if len(message) <= size else cut_at(message, end)


def printable(text: str) -> str:
    """`text` with what is not printable (a newline, a terminal's escape) escaped as repr escapes it, backslashes
    left as they are: a line as a command prints it (cliargs.one_line); `text` itself when all printable."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cut_middle(text: str, size: int, tail: int) -> str:
    """`text` whole when it has at most `size` characters, else its start and its last `tail` characters with
    its length between, at most `size` characters in all: 'head… (100,025 characters in all) …tail'. For text whose
    middle matters least (a long path; a refusal, whose end is its reason), as a command prints it: its callers'
    bounds are characters on a line (cliargs.one_line, executor's _with_config). `size` - `tail` - 2 is at least
    NOTE_BYTES (ValueError)."""
    if size - tail - 2 < NOTE_BYTES:  # 2: the " …" between
        raise ValueError(f"size - tail - 2: expected at least {NOTE_BYTES}, the longest note's; got {size - tail - 2}")
    if len(text) <= size:
        return text
    # The head in characters, as the tail: cut by cut_message's JSON bytes, a character not ASCII counted up to 6,
    # a path of 'é' kept a sixth as much of its start as of its end (until 2026-12-06). The note is given the room
    # it takes as JSON (_note_bytes, never less than its characters), as it had: an ASCII line is cut where it was.
    return f"{cut_at(text, size - tail - 2 - _note_bytes(len(text)))} …{text[len(text) - tail :]}"  # tail 0: none


# A name or id a request sent is shown in a message up to this many characters: generous for a real
# name, and a wrong one of 100 KB makes no 100 KB message, nor one whose start (all that a unary call's
# details and a stream's error_message keep of a long message, `short_details` in service.py) is all name.
NAME_CHARS = 200


def quoted(text: str, chars: int) -> str:
    """A string a request sent (a name, an id, a datatype, a parameter's value), as a message shows
    it: in single quotes, as it is when it is all printable, else with what is not printable (a
    newline, a terminal's escape) and backslashes escaped as repr escapes them, so that it cannot
    break or forge a line of a client's log. Past `chars` characters, its start and its length:
    'mmm'… (100,000 characters in all) (CUT_NOTE)."""
    shown = f"'{_shown_start(text, chars)}'"
    return shown if len(text) <= chars else shown + CUT_NOTE.format(len(text))


def unquoted(text: str, chars: int) -> str:
    """`text` as `quoted` shows it but with no quotes, its length after it where cut: a name that stands alone (a
    progress line's label, `profiling mlp`), where quotes would only be noise."""
    shown = _shown_start(text, chars)
    return shown if len(text) <= chars else shown + CUT_NOTE.format(len(text))


def _shown_start(text: str, chars: int) -> str:
    shown = text[:chars]
    return shown if shown.isprintable() else escaped(shown)


def quoted_name(name: str) -> str:
    """A name (or id) a request sent, as a message shows it (`quoted`), up to NAME_CHARS characters."""
    return quoted(name, NAME_CHARS)


def shown_value(value: object) -> str:
    """A value a refusal names: text as names are (`quoted_name`: quoted, escaped, cut), anything
    else (a number, a boolean, a list) as Python writes it."""
    return quoted_name(value) if isinstance(value, str) else repr(value)


def shown_data(value: object) -> str:
    """A value that came from a file or a JSON body (a config's, a trace's, a result's, an admin API
    body's), as a refusal shows it: in the file's words, JSON's, nested too (true, false and null: True,
    False and None are Python's, no words of the file's), a string as names are (`quoted_name`) and in
    JSON's quotes inside an array or object, an integer too large for a float by its sign and length (a body
    may hold one of thousands of digits), an array or object cut past NAME_CHARS (a list of 20,000 numbers
    made a refusal of 129 KB), a float that is no number (nan, inf) as Python's json writes and reads it: NaN,
    Infinity, -Infinity. A value made by Python code is shown as Python writes it (`shown_value`)."""
    if isinstance(value, str):
        return quoted_name(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        return f"{'a negative' if value < 0 else 'an'} integer of {len(str(abs(value)))} digits"
    if isinstance(value, (list, tuple, dict)):
        return cut_message(_json_words(value, set()), NAME_CHARS)
    return _json_words(value, set())


def shown_entry(table: Mapping, key: str) -> str:
    """The value under `key` of an object from a file or a JSON body, as a refusal shows it (`shown_data`), or
    "none" where the object has no `key`: a value left out is not one written null (`table.get(key)` showed both
    as null)."""
    return shown_data(table[key]) if key in table else "none"


def _json_words(value: object, within: set[int]) -> str:
    """`value` as JSON writes it, a float as Python's json does (NaN, Infinity and -Infinity, which JSON has no
    words for: those a result file holds and json.loads reads; Python's nan, TOML's, is no word of a JSON text's),
    a string's characters that are not printable escaped (a line of a log cannot be broken by one), a table's
    non-string key as the value it is (YAML's), and an array or object within itself (a YAML alias) as `[...]`, as
    repr writes it, rather than without end. Anything else as Python writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if text.isprintable() else "".join(c if c.isprintable() else _json_escape(c) for c in text)
    if isinstance(value, (list, tuple, dict)):
        if id(value) in within:
            return "{...}" if isinstance(value, dict) else "[...]"
        within.add(id(value))
        if isinstance(value, dict):
            text = (
                "{" + ", ".join(f"{_json_words(k, within)}: {_json_words(v, within)}" for k, v in value.items()) + "}"
            )
        else:
            text = "[" + ", ".join(_json_words(v, within) for v in value) + "]"
        within.discard(id(value))
        return text
    return repr(value)


def _json_escape(char: str) -> str:
    """A character that is not printable, as a JSON string escapes it: \\u and four hex digits, a surrogate pair past
    U+FFFF."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escaped(text: str) -> str:
    """`text` with backslashes and the characters that are not printable escaped as repr escapes
    them (\\n, \\x1b, \\u200e); quotes are left as they are."""
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text)


class InterruptedWorkLeft(KeyboardInterrupt):
    """A Ctrl-C that left a model's thread in a batch (`wok profile`'s warm-up): the thread cannot be stopped from
    Python, and Python's exit would wait for it (a stuck model's, for good). A KeyboardInterrupt still, for a caller
    that takes any as a Ctrl-C; the `wok` command says it and leaves at once, through os._exit, as `wok serve` leaves a
    model still running after its stop."""


class ConfigError(ValueError):
    """A model or server configuration is invalid; raised at load, never per request."""


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details for an exception that ended a request; never raises
    (`message_of`): the request's one answer is made from them. A deadline the server enforces is a WokError
    (DeadlineExceeded); any other exception is a bug, wok's or the model's code's, a TimeoutError too (a model's
    check or batch_key that timed out on its own: it was answered DEADLINE_EXCEEDED "deadline exceeded", which
    read as the call's deadline and named nothing)."""
    if isinstance(exc, WokError):
        return exc.code, message_of(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {message_of(exc)}"
