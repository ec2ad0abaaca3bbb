"""What the set-up pages say against the files they describe: docs/kubernetes.md against
deploy/Dockerfile, docs/gpu.md's commands against bench/gpu_session.sh."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def code_lines(markdown: str) -> list[str]:
    """Every line inside a fenced code block, and every inline `code` span."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    lines = [line for block in fenced for line in block.splitlines()]
    return lines + re.findall(r"`([^`\n]+)`", markdown)


def test_kubernetes_doc_names_every_path_the_dockerfile_copies():
    copied = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--from"):
            copied += [w.rstrip("/") for w in words[1:-1]]
    doc = " ".join((ROOT / "docs" / "kubernetes.md").read_text().split())
    m = re.search(r"exactly the paths the Dockerfile copies \(([^)]*)\)", doc)
    assert m, "docs/kubernetes.md no longer lists the paths the Dockerfile copies"
    listed = {p.rstrip("/") for p in re.findall(r"`([^`]+)`", m.group(1))}
    assert listed == set(copied), f"the Dockerfile copies {sorted(copied)}; docs/kubernetes.md lists {sorted(listed)}"


def test_gpu_doc_runs_the_check_with_a_python_that_has_wok():
    commands = [line for line in code_lines((ROOT / "docs" / "gpu.md").read_text()) if "bench/gpu_check.py" in line]
    runs = [c for c in commands if re.search(r"\bpython3?\s+bench/gpu_check\.py", c)]
    assert runs, "docs/gpu.md shows no command that runs bench/gpu_check.py"
    for cmd in runs:
        # A bare `python` has no wok unless it is the environment's own or wok is on its path.
        assert cmd.startswith((".venv/bin/python ", "PYTHONPATH=/tmp/wok-site python3 ")), cmd


def test_gpu_doc_dry_run_uses_the_small_sizes_of_the_session_dry_run():
    session = (ROOT / "bench" / "gpu_session.sh").read_text()
    (small,) = re.findall(r"small=\((--[^)]*)\)", session)
    small = shlex.split(small)
    dry_runs = [
        c for c in code_lines((ROOT / "docs" / "gpu.md").read_text()) if "gpu_check.py" in c and "--device cpu" in c
    ]
    assert dry_runs, "docs/gpu.md shows no dry run of bench/gpu_check.py"
    for cmd in dry_runs:
        words = shlex.split(cmd.split("#")[0])
        given = dict(itertools.pairwise(words))
        want = dict(zip(small[::2], small[1::2]))
        assert {k: given.get(k) for k in want} == want, f"{cmd!r}: without {small} the CPU runs the GPU's model"


def test_architecture_doc_names_every_source_file():
    # The README sends readers there for "every source file"; a new module must get its row.
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"[\w./-]+\.(?:py|sh)\b", doc))
    missing = []
    for top in ("server", "clients", "bench", "demo", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")) + sorted((ROOT / top).rglob("*.sh")):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" or "v2pb" in rel.parts or "__pycache__" in rel.parts:
                continue
            # Named by its path from the repository, from its folder, or by its own name.
            if not any(n == path.name or str(rel).endswith(n) for n in named):
                missing.append(str(rel))
    assert not missing, f"docs/architecture.md names no row for {missing}"
