"""Every `wok` command line that README.md, docs/*.md and deploy/README.md show, in their shell blocks
and inline code, against `wok`'s own parser: its command exists, each option it names is one of that
command's, and a whole command line in a shell block parses. No server runs: the parser alone."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from wok import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```", flags=re.S | re.M)
SHELL = {"sh", "bash", "shell", "console"}  # a block without a language may be a command's output
# Words before a command that run it: their own arguments are skipped (flock's lock file, timeout's limit).
WRAPPERS = {"flock": 1, "timeout": 1, "nohup": 0, "sudo": 0, "env": 0, "exec": 0, "time": 0}
# Options the pages name as history: built for a measurement and not shipped.
NOT_SHIPPED = {
    "--accept-loops": "docs/performance.md: built to test a hypothesis, removed after the measurement",
    "--huge-pages": "docs/performance.md: a side branch's flag, measured and not merged",
}


def snippets(page: Path) -> list[tuple[str, bool]]:
    """(text, whole): each line of the page's code blocks, continuations joined (whole: in a shell
    block, a command line as it is typed), and each inline code span outside the blocks (a command,
    an option named)."""
    text = page.read_text()
    out = []
    for lang, body in FENCE.findall(text):
        if lang.strip() in SHELL or not lang.strip():
            out += [(line, lang.strip() in SHELL) for line in re.sub(r"\\\n", " ", body).splitlines()]
    out += [(span, False) for span in re.findall(r"`([^`\n]+)`", FENCE.sub("", text))]
    return out


def wok_words(text: str) -> list[list[str]]:
    """The arguments of each `wok` command in `text` (after wok, .venv/bin/wok or python -m wok)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: prose or a multi-line `python -c`, no wok command line
        return []
    commands, command = [], []
    for word in [*words, ";"]:
        if word and set(word) <= set(";&|()<>"):
            commands.append(command)
            command = []
        else:
            command.append(word)
    found = []
    for argv in commands:
        while argv and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]) or argv[0] in WRAPPERS):
            argv = argv[1 + WRAPPERS.get(argv[0], 0) :]
        if argv and Path(argv[0]).name == "wok":
            found.append(argv[1:])
        elif len(argv) > 2 and re.fullmatch(r"python3?", Path(argv[0]).name) and argv[1:3] == ["-m", "wok"]:
            found.append(argv[3:])
    return found


@functools.cache
def wok_parser():
    return cli.wok_parser()


def problems(words: list[str], whole: bool) -> list[str]:
    """What `wok`'s parser says against `words`: an unknown command or option, or, for a whole
    command line, a refusal."""
    parser, said = wok_parser(), []
    command = parser
    words = [w.strip("[]") for w in words]
    if {"…", "..."} & set(words):  # elided: `wok … | head`
        return []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if command._commands is not None and not word.startswith("-"):
            if word not in command._commands.choices:
                return [] if word.endswith(":") else [f"no command {word!r} in {command.prog!r}"]
            command = command._commands.choices[word]
        elif word.startswith("--"):
            option = word.partition("=")[0]
            action = command._option_string_actions.get(option)
            if action is None:
                if option not in NOT_SHIPPED:
                    said.append(f"{command.prog!r} has no option {option}")
                continue
            if action.nargs is None and "=" not in word and i < len(words):
                if option == "--serve-args":  # a `wok serve` command line of its own
                    said += [f"--serve-args: {p}" for p in problems(["serve", *shlex.split(words[i])], whole)]
                i += 1
    # A value the reader puts in ($i, PORT) parses as nothing: the line's options were checked above.
    placeholders = any("$" in w or re.fullmatch(r"[A-Z][A-Z_]+", w) for w in words)
    if whole and not said and command is not parser and not placeholders:
        refusal = io.StringIO()
        with contextlib.redirect_stderr(refusal), contextlib.suppress(SystemExit):
            parser.parse_args(words)
        if refusal.getvalue():
            said.append(refusal.getvalue().strip().splitlines()[-1])
    return said


@functools.cache
def doc_commands() -> list[tuple[str, str, list[str], bool]]:
    return [
        (str(page.relative_to(ROOT)), text, words, whole)
        for page in PAGES
        for text, whole in snippets(page)
        for words in wok_words(text)
    ]


def test_the_pages_show_wok_command_lines_and_the_reader_finds_them():
    found = doc_commands()
    lines = [c for c in found if c[3]]
    # A check that finds nothing passes on anything: it must see the README's and the bench page's lines.
    assert len(lines) > 20 and len(found) > 200, (len(lines), len(found))
    assert [".venv/bin/wok serve --port 8001 --models mlp,encoder --grace-period 30", True] in [
        [t.strip(), w] for _, t, _, w in found
    ]


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_every_wok_command_and_option_a_page_shows_is_the_parsers(page):
    wrong = [
        f"{text.strip()[:160]!r}: {'; '.join(said)}"
        for where, text, words, whole in doc_commands()
        if where == page
        for said in [problems(words, whole)]
        if said
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("wok serve --port 8001 --bogus-flag", "'wok serve' has no option --bogus-flag"),
        ("wok compare a.json b.json", "no command 'compare' in 'wok'"),
        ("wok bench ramp --serve-args '--models mlp --nope' --steps 100", "--serve-args: 'wok serve' has no option"),
        ("flock /tmp/x .venv/bin/wok simulate --alpha", "--alpha: expected one argument"),
    ],
)
def test_the_check_finds_what_a_page_could_get_wrong(line, said):
    (words,) = wok_words(line)
    assert any(said in p for p in problems(words, whole=True)), problems(words, whole=True)
