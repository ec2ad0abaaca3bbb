"""bench/batcher_loop_cost.py, small: this checkout against HEAD, one rep; the document's shape,
its figures, full batches at saturation (partial ones across 200 keys), and each process's wok from
its own revision."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import pytest

from wok.bench import batcher_loop_cost as blc

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def _numbers(obj, where: str = ""):
    """Every number in `obj` with its path; booleans are not figures."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{where}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield where, obj


def test_worktree_against_head_gives_finite_figures_full_batches_and_each_revisions_own_wok(tmp_path, capsys):
    out = tmp_path / "loop.json"
    argv = ["--rev", "worktree", "--rev", "HEAD", "--reps", "1", "--n", "320", "--warmup", "64"]
    rc = blc.main([*argv, "--host-probe", "0", "--json", str(out)])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr[-3000:]
    doc = json.loads(out.read_text())

    assert doc["schema"] == "wok.batcher_loop_cost/1"
    assert list(doc) == ["schema", "created", "host", "config", "revisions", "host_probe", "runs", "summary"]
    cfg = doc["config"]
    assert cfg["revs"] == ["worktree", "HEAD"] and cfg["orders"] == [["worktree", "HEAD"]]
    assert cfg["stopped"] is None and doc["host_probe"] is None
    assert list(cfg["cases"]) == list(blc.CASES) == list(doc["summary"])
    assert cfg["cases"]["slo_200keys"] == {"policy": "slo", "keys": 200, "timeout_s": None, "window": 256}
    assert cfg["cases"]["fixed_1key"]["window"] == cfg["window"] == blc.WINDOW

    # Each process imported its own revision: the package folder and the batcher.py blob.
    head = _git("rev-parse", "HEAD")
    head_blob = _git("rev-parse", f"{head}:server/batcher.py")
    data = (ROOT / "server" / "batcher.py").read_bytes()
    worktree_blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert doc["revisions"]["HEAD"]["commit"] == head
    assert doc["revisions"]["worktree"]["commit"] == head
    runs = {r["rev"]: r for r in doc["runs"]}
    assert sorted(runs) == ["HEAD", "worktree"] and all(r["rep"] == 1 for r in doc["runs"])
    assert runs["worktree"]["imported_from"] == "server/batcher.py"
    assert runs["worktree"]["batcher_blob"] == worktree_blob
    assert runs["HEAD"]["imported_from"] == f".bench-peers/wok@{head}/wok/batcher.py"
    assert runs["HEAD"]["batcher_blob"] == head_blob

    # Every figure finite and positive (the ratios too), the keys of each summary cell as documented.
    numbers = list(_numbers({"runs": doc["runs"], "summary": doc["summary"]}))
    assert numbers and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for _, v in numbers), [
        (w, v) for w, v in numbers if not (math.isfinite(v) and v > 0)
    ]
    for case, per_rev in doc["summary"].items():
        assert list(per_rev) == ["worktree", "HEAD"]
        for rev, cell in per_rev.items():
            assert list(cell) == [
                "loop_cpu_us_per_request",
                "wall_us_per_request",
                "requests_per_batch",
                "ratio_to_first",
            ]
            assert cell["loop_cpu_us_per_request"]["n"] == 1
            rpb = cell["requests_per_batch"]["median"]
            if blc.saturated(case):  # WINDOW in flight, whole batches per key: every batch leaves full
                assert rpb == blc.MAX_BATCH, (case, rev)
            else:  # slo_200keys: a key holds a few requests at most; its batches leave by the slo rules
                assert 1 <= rpb < blc.MAX_BATCH, (case, rev, rpb)
            one = runs[rev]["cases"][case]
            assert one["requests"] == 320 and len(one["runs_loop_cpu_us_per_request"]) == blc.RUNS_PER_PROCESS
            paired = cell["ratio_to_first"]["paired"]["median"]
            assert paired == pytest.approx(
                one["loop_cpu_us_per_request"] / runs["worktree"]["cases"][case]["loop_cpu_us_per_request"]
            )
        assert per_rev["worktree"]["ratio_to_first"]["of_medians"] == 1.0

    assert "loop CPU µs/request, median [min-max]" in stdout
    assert sum(line.startswith("fixed_4keys_timeout") for line in stdout.splitlines()) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rev", "no-such-rev"], "--rev: git does not know revision 'no-such-rev'"),
        (
            ["--rev", "HEAD;ls"],
            "--rev: expected worktree or a git revision (letters, digits and _.~^/-); got 'HEAD;ls'",
        ),
        (["--rev", "HEAD", "--rev", "HEAD"], "--rev: expected each revision once; got HEAD more than once"),
        (["--cases", "fixed_1key,nosuch"], "--cases: expected some of fixed_1key"),
        (["--n", "0"], "--n: expected an integer >= 1; got 0"),
    ],
)
def test_a_bad_option_exits_2_naming_it_before_any_process_starts(argv, message, capsys, monkeypatch):
    def started(*a, **kw):
        raise AssertionError(f"a process was started: {a}")

    monkeypatch.setattr(blc, "run_child", started)
    with pytest.raises(SystemExit) as exc:
        blc.main([*argv, "--host-probe", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: " in err[-1] and message in err[-1]
