"""Every command line that README.md and the markdown pages under docs/ and deploy/ (the results'
READMEs, deploy/k8s/generated/README.md) show, in their shell blocks and inline code, against the parser of the
command it runs: a `wok` command's (its command exists, each option it names is one of that
command's, and a whole command line in a shell block parses), a bench script's (`python
bench/X.py`, `python -m wok.bench.X`: the script's `build_parser()`) and a recorded script's
(`python docs/results/…/X.py`: the options its source declares). An option named alone in the
prose (`--warmup 5s`) or a shell block's comment must be one of some `wok` command or script, or
of a tool named below. A record's command line naming an option that was never shipped stays as
it was run, and its block's comment names that option (what it was, what runs today). No server
runs: the parsers alone."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import io
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from wok import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]
# Folders of the environment, caches and builds: their markdown is not the project's (.gitignore).
NOT_PAGES = {".git", ".venv", ".pytest_cache", ".ruff_cache", "__pycache__", "build", "dist", "out", ".bench-peers"}
SCRIPTS = [
    str(p.relative_to(ROOT))
    for p in [*sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "docs" / "results").glob("*/*.py"))]
    if p.name != "__init__.py"
]
FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```", flags=re.S | re.M)
SHELL = {"sh", "bash", "shell", "console"}  # a block without a language may be a command's output
# Words before a command that run it: their own arguments are skipped (flock's lock file, timeout's limit).
WRAPPERS = {"flock": 1, "timeout": 1, "nohup": 0, "sudo": 0, "env": 0, "exec": 0, "time": 0}
# A script run by its path, after python or first on its line (`bench/compare.py --reps 8`).
SCRIPT = re.compile(r"(?:\./)?(bench/\w+\.py|docs/results/[\w.-]+/\w+\.py)")
# An option as the prose names it; `--cpu-*` stands for every option it begins.
FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w.-]*\*?")
# Options the pages name as history: built for a measurement and not shipped.
NOT_SHIPPED = {
    "--accept-loops": "docs/performance.md: built to test a hypothesis, removed after the measurement",
    "--huge-pages": "docs/performance.md: a side branch's flag, measured and not merged",
    "--no-wakeup-drain": "docs/performance.md: the wake-up drain's off switch while it was on by default, before "
    "7795519 (never committed; the drain shipped off, `--wakeup-drain` turns it on)",
}
# Other tools whose command lines the pages show inline: their options are theirs, not checked here.
OTHER_TOOLS = {
    "perf": "Linux perf (`perf record … --call-graph dwarf`): how performance.md's worker profiles were taken",
    "perf_analyzer": "Triton's load generator (`--concurrency-range`): deploy/README.md's traffic for Prometheus",
    "pip": "pip (`--no-build-isolation`): how docs/gpu.md's session script installs wok on a lent host",
    "py-spy": "py-spy (`record --nonblocking --threads --idle`): a results README's profile of the worker",
    "ruff": "the linter (`ruff --fix`): performance.md's note on a peer's server script changed after the runs",
}
# Other tools' options the pages name alone, beside the tool's name in the sentence.
OTHER_OPTIONS = {
    "--nonblocking": "py-spy record's: docs/performance.md says how the server was profiled without pausing it",
    "--server-side": "kubectl apply's: docs/plan.md's server-side apply of the manifests",
    "--web.listen-address": "Prometheus': deploy/README.md's choice of port for the Prometheus it runs",
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
    out += [(span, False) for span in prose_spans(text)]
    return out


def prose_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", FENCE.sub("", text))


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its comment ('' without one)."""
    command, *comment = re.split(r"(?:^|\s)#", line, maxsplit=1)
    return command, "".join(comment)


def shell_comments(text: str) -> list[str]:
    """The comments of the page's shell blocks (a record's note on what runs today among them)."""
    return [
        split_comment(line)[1]
        for lang, body in FENCE.findall(text)
        if lang.strip() in SHELL
        for line in body.splitlines()
        if split_comment(line)[1]
    ]


@functools.cache  # each span is read for wok's commands, the scripts' and the options named alone
def command_lines(text: str) -> tuple[tuple[str, ...], ...]:
    """The words of each command in `text` (split at ; & | ( ) < >), without the words before it
    that run it (`flock LOCK`, `VAR=value`)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: prose or a multi-line `python -c`, no command line
        return ()
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
        if argv:
            found.append(tuple(argv))
    return tuple(found)


def wok_words(text: str) -> list[tuple[str, ...]]:
    """The arguments of each `wok` command in `text` (after wok, .venv/bin/wok or python -m wok)."""
    found = []
    for argv in command_lines(text):
        if Path(argv[0]).name == "wok":
            found.append(argv[1:])
        elif len(argv) > 2 and re.fullmatch(r"python3?", Path(argv[0]).name) and argv[1:3] == ("-m", "wok"):
            found.append(argv[3:])
    return found


def script_words(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(script, its arguments) of each bench or recorded script run in `text`: `python bench/X.py`,
    `python -m wok.bench.X`, `python docs/results/…/X.py`, or the script's path first on its line."""
    found = []
    for argv in command_lines(text):
        if re.fullmatch(r"python3?", Path(argv[0]).name):
            argv = argv[1:]
            if len(argv) > 1 and argv[0] == "-m" and argv[1].startswith("wok.bench."):
                found.append((f"bench/{argv[1].removeprefix('wok.bench.')}.py", argv[2:]))
                continue
        match = SCRIPT.fullmatch(argv[0]) if argv else None
        if match:
            found.append((match.group(1), argv[1:]))
    return found


@functools.cache
def wok_parser():
    return cli.wok_parser()


@functools.cache
def script_parser(script: str) -> argparse.ArgumentParser:
    """A bench script's parser (its `build_parser()`; one without options takes none), or a recorded
    script's (`recorded_parser`)."""
    if script.startswith("docs/results/"):
        return recorded_parser(ROOT / script)
    if "def build_parser(" not in (ROOT / script).read_text():  # a library module, not imported for nothing
        return argparse.ArgumentParser(prog=script)
    return importlib.import_module(f"wok.bench.{Path(script).stem}").build_parser()


def recorded_parser(path: Path) -> argparse.ArgumentParser:
    """The options a recorded script's source declares (its add_argument calls: their literal names,
    action and nargs). Read, not imported: such a script parses its arguments and runs as it is
    imported. `parses` is False for one that reads sys.argv itself: only the options it is given
    are checked (it has none)."""
    parser = argparse.ArgumentParser(prog=str(path.relative_to(ROOT)))
    parser.parses = False
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            kept = {"action", "nargs"}
            kwargs = {
                k.arg: k.value.value for k in node.keywords if k.arg in kept and isinstance(k.value, ast.Constant)
            }
            parser.add_argument(*names, **kwargs)
            parser.parses = True
    return parser


def serve_words(option: str, value: str) -> list[str] | None:
    """The `wok serve` arguments an option's value holds (`--serve-args`, `--wok-variant NAME=ARGS`),
    or None when its value is not a command line."""
    if option == "--serve-args":
        return shlex.split(value)
    if option == "--wok-variant":
        return shlex.split(value.partition("=")[2])
    return None


def problems(words: Sequence[str], whole: bool, parser: argparse.ArgumentParser | None = None) -> list[str]:
    """What the parser (`wok`'s unless given) says against `words`: an unknown command or option,
    or, for a whole command line, a refusal."""
    parser = parser or wok_parser()
    command, said = parser, []
    words = [w.strip("[]") for w in words]
    if {"…", "..."} & set(words):  # elided: `wok … | head`
        return []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        commands = getattr(command, "_commands", None)  # wok's parsers keep their subcommands here
        if commands is not None and not word.startswith("-"):
            if word not in commands.choices:
                return [] if word.endswith(":") else [f"no command {word!r} in {command.prog!r}"]
            command = commands.choices[word]
        elif word.startswith("--"):
            option, eq, value = word.partition("=")
            action = command._option_string_actions.get(option)
            if action is None:
                if option not in NOT_SHIPPED:
                    said.append(f"{command.prog!r} has no option {option}")
                continue
            takes_next = action.nargs is None and not eq and i < len(words)
            serve = serve_words(option, value if eq else (words[i] if takes_next else ""))
            if serve:
                said += [f"{option}: {p}" for p in problems(["serve", *serve], whole)]
            i += takes_next
    # A value the reader puts in ($i, PORT) parses as nothing, nor does an option not shipped (its
    # block says so: unmarked_records): the line's options were checked above.
    placeholders = any("$" in w or re.fullmatch(r"[A-Z][A-Z_]+", w) or w in NOT_SHIPPED for w in words)
    parses = getattr(parser, "parses", True) and (command is not parser or getattr(parser, "_commands", None) is None)
    if whole and not said and parses and not placeholders:
        refusal = io.StringIO()
        with contextlib.redirect_stderr(refusal), contextlib.redirect_stdout(io.StringIO()):
            with contextlib.suppress(SystemExit):
                parser.parse_args(words)
        if refusal.getvalue():
            said.append(refusal.getvalue().strip().splitlines()[-1])
    return said


@functools.cache
def doc_commands() -> list[tuple[str, str, str, tuple[str, ...], bool]]:
    """(page, text, command, words, whole): each `wok` command (command "wok") and script run the
    pages show, with its arguments."""
    return [
        (str(page.relative_to(ROOT)), text, command, words, whole)
        for page in PAGES
        for text, whole in snippets(page)
        for command, words in [*(("wok", words) for words in wok_words(text)), *script_words(text)]
    ]


def command_problems(command: str, words: Sequence[str], whole: bool) -> list[str]:
    """`problems` with the parser of `command` ("wok", or a script's path)."""
    if command == "wok":
        return problems(words, whole)
    return problems(words, whole, script_parser(command)) if command in SCRIPTS else [f"no script {command}"]


@functools.cache
def every_option() -> frozenset[str]:
    """The options of every `wok` command, bench script and recorded script."""
    options: set[str] = set()

    def add(parser) -> None:
        options.update(s for action in parser._actions for s in action.option_strings)
        commands = getattr(parser, "_commands", None)
        for sub in commands.choices.values() if commands else ():
            add(sub)

    add(wok_parser())
    for script in SCRIPTS:
        add(script_parser(script))
    return frozenset(options)


def unknown_options(span: str) -> list[str]:
    """The options an inline span names that no command, script or tool (OTHER_OPTIONS) has; none
    for a command line (checked against its own command's parser) or another tool's (OTHER_TOOLS).
    An option named alone is not tied to a command: the prose beside it names several (tied to the
    command last named in its paragraph, 203 of 347 such options were another command's)."""
    lines = command_lines(span)
    if wok_words(span) or script_words(span) or (lines and lines[0][0] in OTHER_TOOLS):
        return []
    known = every_option() | NOT_SHIPPED.keys() | OTHER_OPTIONS.keys()
    return [
        flag
        for flag in FLAG.findall(span)
        if not (flag in known or (flag.endswith("*") and any(o.startswith(flag[:-1]) for o in known)))
    ]


def unmarked_records(text: str) -> list[str]:
    """The command lines of the page's shell blocks that name an option not shipped (NOT_SHIPPED)
    which no comment of their block names. A record's command stays as it was run; its block says
    what the option was and what runs today (performance.md: "# …: the same comparison with
    today's flags")."""
    unmarked = []
    for lang, body in FENCE.findall(text):
        if lang.strip() not in SHELL:
            continue
        lines = [split_comment(line) for line in re.sub(r"\\\n", " ", body).splitlines()]
        marked = {flag for _, comment in lines for flag in FLAG.findall(comment)}
        for command, _ in lines:
            if wok_words(command) or script_words(command):
                unmarked += [
                    f"{command.strip()[:120]!r}: {f}"
                    for f in sorted(set(FLAG.findall(command)) & NOT_SHIPPED.keys() - marked)
                ]
    return unmarked


def test_every_markdown_page_of_the_project_is_one_the_check_reads():
    # A list of pages by hand left deploy/k8s/generated/README.md, whose `wok plan` line regenerates the
    # committed manifests, unchecked.
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_PAGES and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    unread = sorted(str(p.relative_to(ROOT)) for p in set(found) - set(PAGES))
    assert not unread, f"{unread}: markdown pages that PAGES leaves out"


def test_the_pages_show_wok_command_lines_and_the_reader_finds_them():
    found = [(page, text, words, whole) for page, text, command, words, whole in doc_commands() if command == "wok"]
    lines = [c for c in found if c[3]]
    # A check that finds nothing passes on anything: it must see the README's and the bench page's lines.
    assert len(lines) > 20 and len(found) > 200, (len(lines), len(found))
    assert [".venv/bin/wok serve --port 8001 --models mlp,encoder --grace-period 30", True] in [
        [t.strip(), w] for _, t, _, w in found
    ]


def test_the_pages_show_script_command_lines_and_the_reader_finds_them():
    found = [c for c in doc_commands() if c[2] != "wok"]
    # performance.md's compare.py lines, continued over several, and the scripts run as modules.
    assert len([c for c in found if c[4]]) > 30 and {"bench/compare.py", "bench/chaos.py"} <= {c[2] for c in found}
    assert ("docs/performance.md", "bench/compare.py", True) in [
        (page, script, whole) for page, text, script, words, whole in found if "--wok-variant" in words
    ]
    assert any(c[2].startswith("docs/results/") for c in found)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_and_option_a_page_shows_is_its_parsers(page):
    wrong = [
        f"{text.strip()[:160]!r}: {'; '.join(said)}"
        for where, text, command, words, whole in doc_commands()
        if where == page
        for said in [command_problems(command, words, whole)]
        if said
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_every_option_a_page_names_alone_is_a_commands(page):
    wrong = [
        f"{span[:160]!r}: no command or script has {', '.join(flags)}"
        for span in [*prose_spans((ROOT / page).read_text()), *shell_comments((ROOT / page).read_text())]
        for flags in [unknown_options(span)]
        if flags
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_a_command_line_with_an_option_not_shipped_is_marked_in_its_block(page):
    unmarked = unmarked_records((ROOT / page).read_text())
    assert not unmarked, "\n".join(unmarked)


def test_each_exemption_is_needed():
    pages = "\n".join(p.read_text() for p in PAGES)
    spans = [span for p in PAGES for span in prose_spans(p.read_text())]
    shipped = every_option() & (NOT_SHIPPED.keys() | OTHER_OPTIONS.keys())
    assert not shipped, f"{sorted(shipped)}: a command's or script's option now, not an exemption"
    unnamed = [flag for flag in [*NOT_SHIPPED, *OTHER_OPTIONS] if not re.search(rf"{flag}(?![\w-])", pages)]
    unnamed += [
        tool for tool in OTHER_TOOLS if not any(span.split()[0] == tool and FLAG.search(span) for span in spans)
    ]
    assert not unnamed, f"{unnamed}: no page names them any more"


def test_every_bench_script_with_options_builds_its_parser_apart():
    # The check above reads a script's options from its build_parser(); one built inside main()
    # could not be read without running the script.
    missing = [
        script
        for script in SCRIPTS
        if script.startswith("bench/")
        and "ArgumentParser(" in (ROOT / script).read_text()
        and not hasattr(importlib.import_module(f"wok.bench.{Path(script).stem}"), "build_parser")
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("wok serve --port 8001 --bogus-flag", "'wok serve' has no option --bogus-flag"),
        ("wok compare a.json b.json", "no command 'compare' in 'wok'"),
        ("wok bench ramp --serve-args '--models mlp --nope' --steps 100", "--serve-args: 'wok serve' has no option"),
        ("wok bench ramp --serve-args='--nope'", "--serve-args: 'wok serve' has no option --nope"),
        ("flock /tmp/x .venv/bin/wok simulate --alpha", "--alpha: expected one argument"),
    ],
)
def test_the_check_finds_what_a_page_could_get_wrong(line, said):
    (words,) = wok_words(line)
    assert any(said in p for p in problems(words, whole=True)), problems(words, whole=True)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (".venv/bin/python bench/compare.py --servers wok --reps 3 --plots x.png", "has no option --plots"),
        ("python3 -m wok.bench.chaos --seconds", "--seconds: expected one argument"),
        ("bench/tune_check.py --reps three", "--reps: expected an integer"),
        (
            "python bench/compare.py --servers wok,wok-a --wok-variant 'wok-a=--accept-tasks 0 --drain'",
            "--wok-variant: 'wok serve' has no option --drain",
        ),
        ("python bench/stream_vs_unary.py --serve-args '--models mlp --nope'", "--serve-args: 'wok serve' has no"),
        (".venv/bin/python docs/results/lean-worker-2026-12-01/lean_worker.py --rows", "expected one argument"),
        ("python docs/results/host-probe-2026-11-30/correlate.py x.json --rates 100", "has no option --rates"),
        ("python bench/compare_all.py --reps 3", "no script bench/compare_all.py"),
    ],
)
def test_the_check_finds_what_a_pages_script_line_could_get_wrong(line, said):
    ((script, words),) = script_words(line)
    found = command_problems(script, words, whole=True)
    assert any(said in p for p in found), found


@pytest.mark.parametrize(
    ("span", "unknown"),
    [
        ("--warmup 5s", []),
        ("--no-such-option 5", ["--no-such-option"]),
        ("the server's --max-request-bytes and its --max-request-size", ["--max-request-size"]),
        ("--cpu-*", []),
        ("--gpu-*", ["--gpu-*"]),
        ("wok serve --no-such-option", []),  # a command line: its own parser's check
        ("ruff --fix", []),
        ("--fix", ["--fix"]),  # ruff's, named alone: not in OTHER_OPTIONS
    ],
)
def test_the_check_finds_an_option_the_prose_names_that_no_command_has(span, unknown):
    assert unknown_options(span) == unknown


RECORD = """```sh
.venv/bin/python bench/compare.py --servers wok,wok-huge --wok-variant "wok-huge=--huge-pages" --reps 10
{comment}
```
"""


@pytest.mark.parametrize(
    ("comment", "unmarked"),
    [
        ("", ["--huge-pages"]),
        ("# the side branch's flag", ["--huge-pages"]),
        ("# --huge-pages: the side branch's flag, not merged", []),
    ],
)
def test_the_check_finds_a_record_whose_block_does_not_say_what_its_option_was(comment, unmarked):
    found = unmarked_records(RECORD.format(comment=comment))
    assert [line.rpartition(": ")[2] for line in found] == unmarked, found
