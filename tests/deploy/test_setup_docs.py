"""What the set-up pages say against the files they describe: docs/kubernetes.md against
deploy/Dockerfile, docs/gpu.md's commands against bench/gpu_session.sh."""

from __future__ import annotations

import ast
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
        assert cmd.startswith(".venv/bin/python ") or re.match(r"PYTHONPATH=/tmp/wok-site\.X+ python3 ", cmd), cmd


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


def test_the_metrics_render_interval_is_the_one_the_docs_and_the_scrape_config_give():
    # /metrics is rendered at most once per RENDER_INTERVAL_S; a scraper set below it waits for each
    # render, so the pages that set or describe the scrape interval must say so, with the code's figure.
    from wok import http

    pages = {
        "docs/metrics.md": r"rendered at most once every ([\d.]+) s",
        "deploy/README.md": r"rendered at most once every ([\d.]+) s",
        "deploy/prometheus/prometheus.yml": r"at most once\s*#?\s*every ([\d.]+) s",
    }
    for page, said in pages.items():
        text = (ROOT / page).read_text()
        figures = {float(f) for f in re.findall(said, text)}
        assert figures == {http.RENDER_INTERVAL_S}, (
            f"{page} says {sorted(figures)} s; the code: {http.RENDER_INTERVAL_S} s"
        )
        below = rf"below {http.RENDER_INTERVAL_S:g} ?s\b"
        assert re.search(below, text), f"{page} does not warn of a scrape interval below {http.RENDER_INTERVAL_S:g} s"


def test_every_test_that_needs_cuda_is_one_the_gpu_sessions_cuda_step_runs():
    # The machines this project builds on have no GPU: a CUDA test that bench/gpu_session.sh does not run
    # (its file not listed, or a name `-k cuda` leaves out) is never run at all.
    session = (ROOT / "bench" / "gpu_session.sh").read_text()
    (step,) = re.findall(r"^step cuda_tests .*?(?<!\\)$", session, re.MULTILINE | re.DOTALL)
    words = shlex.split(step.replace("\\\n", " "))
    assert '"${cuda_files[@]}"' in step and words[words.index("-k") + 1] == "cuda", step
    (files,) = re.findall(r"^cuda_files=\((.*?)^\)", session, re.MULTILINE | re.DOTALL)
    listed = {w for w in shlex.split(files, comments=True) if w.startswith("tests/")}
    left_out = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        # A module-wide mark (pytestmark = skipif(not torch.cuda.is_available(), ...)) gates every test in it.
        gated = any(
            isinstance(n, ast.Assign)
            and any(getattr(target, "id", None) == "pytestmark" for target in n.targets)
            and "cuda.is_available" in ast.get_source_segment(source, n)
            for n in tree.body
        )
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test"):
                continue
            marks = " ".join(ast.get_source_segment(source, d) for d in node.decorator_list)
            if gated or "cuda.is_available" in marks:
                # -k cuda selects by the test's name or, for a parametrized one, the id of a "cuda:N" value.
                selected = "cuda" in node.name or '"cuda' in marks
                where = str(path.relative_to(ROOT))
                if where not in listed or not selected:
                    left_out.append(f"{where}::{node.name}")
    assert not left_out, f"bench/gpu_session.sh's cuda_tests step does not run {left_out}"
