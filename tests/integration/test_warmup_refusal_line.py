"""A model whose start-up warm-up fails with a long message, or one holding a terminal's escape: `wok serve` says
one bounded line (exit 2), its model's message cut as a failed batch's is everywhere else (errors.cut_message), and
`wok profile` refuses the model in the very same words. `wok serve` printed the WarmupError whole (a 1 MB line,
the raw escape), and the profile's line, cut and escaped by its own rules (cliargs.one_line), said otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from wok.__main__ import main
from wok.errors import CUT_NOTE, MESSAGE_CHARS, NOTE_BYTES

from ..conftest import write_python_model

LOUD_MODEL = """
from torch import nn


class Loud(nn.Module):
    def forward(self, x):
        raise RuntimeError(MESSAGE)


def build():
    return Loud()
"""

LONG = 1_000_000
FAILED = "model 'loud' failed: RuntimeError: "
PROFILE_SAYS = "wok profile: wok serve refuses the model at its start: "


def _serve_refusal(folder):
    """`wok serve` of the repository holding `folder`, refused at its start (status 2): its run and the one line
    that says the model's failure."""
    cmd = [sys.executable, "-m", "wok", "serve", "--model-repository", str(folder.parent), "--port", "0"]
    done = subprocess.run([*cmd, "--metrics-port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-4000:]
    said = [line for line in done.stderr.splitlines() if line.startswith(f"wok: {FAILED}")]
    assert len(said) == 1, done.stderr[-4000:]
    return done, said[0]


@pytest.mark.parametrize("message", ['"y" * 1_000_000', '"\\x1b[31mred"'], ids=["1 MB message", "terminal escape"])
def test_a_warm_up_failure_is_one_bounded_line_that_wok_profile_says_alike(tmp_path, capsys, message):
    folder = write_python_model(tmp_path / "repo" / "loud", LOUD_MODEL.replace("MESSAGE", message))
    config = folder / "config.toml"
    done, line = _serve_refusal(folder)
    assert line.endswith(
        f"; in the start-up warm-up, on a batch of zeros with input shapes 'INPUT0' [1, 4] on cpu (config: {config})"
    ), line[-2000:]
    assert len(line) <= MESSAGE_CHARS, f"{len(line):,} characters"
    assert "\x1b" not in done.stderr, line[:2000]
    if message.startswith('"y"'):
        # The model's part (FAILED and its message) is cut, its note giving the whole length; the context is whole.
        assert line.startswith(f"wok: {FAILED}yyy"), line[:200]
        assert CUT_NOTE.format(len(FAILED) + LONG) + "; in the start-up warm-up" in line, line[-2000:]
    else:
        assert line.startswith(f"wok: {FAILED}\\x1b[31mred; in the start-up warm-up"), line
    # No other line repeats the message.
    assert len(done.stderr) < 2 * MESSAGE_CHARS, f"{len(done.stderr):,} characters on stderr"

    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "loud", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    assert err == f"{PROFILE_SAYS}{line.removeprefix('wok: ')}\n", err[-3000:]


# Folders of a config path of about 2,000 characters or more: one's name under NAME_MAX (255 bytes), the whole under
# PATH_MAX (4,096 bytes, 2 a character for 'é').
LONG_PATHS = {"ascii": [letter * 220 for letter in "abcdefghij"], "not ascii": ["é" * 118] * 16}


@pytest.mark.parametrize("folders", LONG_PATHS.values(), ids=LONG_PATHS.keys())
def test_a_long_config_path_is_cut_in_its_middle_alike_by_wok_serve_and_wok_profile(tmp_path, capsys, folders):
    """A warm-up failure's refusal with a model message at its bound and a config path of about 2,000 characters:
    the path is cut in its middle, saying how long it was, its start and end kept, and both commands say the same
    words. Each command's one_line cut the line again at its own point (the profile's words before it moved it), in
    the middle of the path, its note counting the first cut's text. A path not ASCII kept a sixth as much of its
    start as of its end (errors.cut_middle measured its start in JSON bytes, 6 for 'é', its end in characters)."""
    deep = tmp_path.joinpath(*folders)
    folder = write_python_model(deep / "repo" / "loud", LOUD_MODEL.replace("MESSAGE", '"y" * 1_000_000'))
    config = str(folder / "config.toml")
    assert len(config) > 1_950
    _, line = _serve_refusal(folder)
    assert len(line) <= MESSAGE_CHARS, f"{len(line):,} characters"
    # One cut in the model's message, one in the path, each counting its own text.
    assert CUT_NOTE.format(len(FAILED) + LONG) + "; in the start-up warm-up" in line, line[-3000:]
    start, cut, end = line.partition(f" ({len(config):,} characters in all) …")
    assert cut, line[-3000:]
    shown_start = start.rpartition("(config: ")[2].removesuffix("…")
    assert config.startswith(shown_start) and len(shown_start) > 500, start[-300:]
    assert end.endswith(")") and config.endswith(end[:-1]) and len(end) > 500, end[-300:]
    # Start and end in equal measure: characters, as many each but the note's room.
    assert abs(len(shown_start) - len(end[:-1])) <= NOTE_BYTES, (len(shown_start), len(end[:-1]))

    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    assert main(["profile", "loud", "--model-repository", str(folder.parent), *fast]) == 2
    err = capsys.readouterr().err
    assert err == f"{PROFILE_SAYS}{line.removeprefix('wok: ')}\n", err[-3000:]
