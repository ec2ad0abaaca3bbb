"""The code base is lint-clean and formatted (generated stubs in server/v2pb are excluded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_passes():
    r = ruff("check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied():
    r = ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
