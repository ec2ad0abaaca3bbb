"""scripts/bootstrap.py COMMAND --help (or -h): the usage, exit 0, and nothing installed nor run.

In this process: bootstrap's install and hand-over steps are replaced by stand-ins that fail the
test, so a --help that is not taken as such shows as an install, not as a real one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BOOTSTRAP = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap.py"


@pytest.fixture
def bootstrap(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("wok_bootstrap_help", BOOTSTRAP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def must_not_run(*args, **kwargs):
        raise AssertionError(f"--help went on to install or run: {args}")

    for step in ("ensure_venv", "ensure_torch", "pip", "run", "hand_over"):
        monkeypatch.setattr(mod, step, must_not_run)
    monkeypatch.setenv("WOK_VENV", str(tmp_path / "venv"))
    return mod


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize(
    ("argv", "note"),
    [
        (["install"], "install: installs only; it takes no options."),
        (["serve"], "serve: the options after it are `wok serve`'s; once installed, `wok serve --help` lists them."),
        (
            ["serve", "--models", "mlp"],
            "serve: the options after it are `wok serve`'s; once installed, `wok serve --help` lists them.",
        ),
        (["test"], "test: the options after it are pytest's; once installed, `python -m pytest --help` lists them."),
        (
            ["test", "-x"],
            "test: the options after it are pytest's; once installed, `python -m pytest --help` lists them.",
        ),
    ],
)
def test_help_after_a_command_prints_the_usage_and_installs_nothing(bootstrap, capsys, tmp_path, argv, flag, note):
    assert bootstrap.main([*argv, flag]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == f"{bootstrap.__doc__}\n{note}\n"
    assert not (tmp_path / "venv").exists()


def test_the_usage_says_what_test_runs_without_naming_the_scripts_functions(bootstrap):
    # It sent the reader to `suite_passes` and `run_suite` for what `test` runs and its status on Ctrl-C.
    import inspect
    import re

    usage = bootstrap.__doc__
    own = [name for name, value in vars(bootstrap).items() if inspect.isfunction(value) and "_" in name]
    assert "suite_passes" in own and "run_suite" in own
    assert not [name for name in own if re.search(rf"\b{name}\b", usage)]
    # What it says instead, as the passes are made.
    two, one = bootstrap.suite_passes(Path("python"), 2), bootstrap.suite_passes(Path("python"), 1)
    assert len(two) == 2 and len(one) == 1
    assert two[0][-2:] == ["-m", "not serial"] and two[1][-2:] == ["-m", "serial"] and "2" in two[0]
    slowest = next(arg for arg in one[0] if arg.startswith("--durations=")).partition("=")[2]
    flat = " ".join(usage.split())
    assert "with two or more CPUs in two pytest passes, the tests not marked `serial` on two workers" in flat
    assert f"its {slowest} slowest tests" in flat and "128 + the signal's number (130 for Ctrl-C)" in flat
