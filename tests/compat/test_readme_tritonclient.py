"""README's tritonclient snippet ("Calling it"), run as written against a real server.

In a child process of its own, as a Triton user would run it, with only the address changed to
the test server's; what it prints is what the snippet's comments say it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "127.0.0.1:8001"  # the README's, wok serve's default


def snippet() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Calling it\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S) if "tritonclient" in b]
    assert len(blocks) == 1, f"README's 'Calling it': expected one tritonclient snippet; got {len(blocks)}"
    return blocks[0]


def test_the_readmes_tritonclient_snippet_runs_and_prints_what_it_says(server_process, tmp_path):
    code = snippet()
    assert ADDRESS in code, code
    said = [line.partition("# ")[2].strip() for line in code.splitlines() if line.startswith("print(")]
    assert said and all(said), f"every print of the snippet says what it prints: {code}"
    proc = subprocess.run(
        [sys.executable, "-c", code.replace(ADDRESS, server_process.target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == said, (proc.stdout, said)
