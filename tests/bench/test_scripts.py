"""The standalone scripts of bench/ run as files (`python bench/NAME.py`, as the docs show them),
where a relative import has no package to be relative to: it fails only when reached, which for an
import inside a function can be after the whole measurement."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8"))


def test_there_are_scripts_to_check():
    assert len(_scripts()) >= 10


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: p.name)
def test_a_script_run_as_a_file_imports_nothing_relatively(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = [
        f"line {n.lineno}: from {'.' * n.level}{n.module or ''}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level > 0
    ]
    assert not relative, f"{path.name} is run as a file, where these fail: {relative}"
