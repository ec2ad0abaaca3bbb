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
