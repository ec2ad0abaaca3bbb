"""docs/bench-schema.md describes the JSON of every standalone bench script that writes a
schema-versioned document: eleven wrote one that no doc named a field of."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bench-schema.md"

# Each script and the schema its --json writes.
SCRIPTS = {
    "accept_rate": "wok.acceptrate/2",
    "balancer_overhead": "wok.balancer_overhead/1",
    "ceiling": "wok.ceiling/1",
    "chaos": "wok.chaos/1",
    "cold_batch": "wok.cold_batch/1",
    "gpu_check": "wok.gpu_check/2",
    "latency_breakdown": "wok.latency_breakdown/1",
    "linear_kernels": "wok.linear_kernels/1",
    "metrics_overhead": "wok.metrics_overhead/1",
    "queue_memory": "wok.queue_memory/1",
    "refusal_cost": "wok.refusal_cost/1",
    "stream_vs_unary": "wok.stream_vs_unary/1",
    "thread_sizing": "wok.thread_sizing/1",
    "unhandled_cost": "wok.unhandled_cost/1",
    "large_decode": "wok.large_decode/1",
    "id_check_chunks": "wok.id_check_chunks/1",
}


RESULTS = ROOT / "docs" / "results"
# JSON under docs/results/ that is no wok result, by path (fnmatch, from docs/results/): what these tests skip.
NOT_WOK_RESULTS = {
    "loop-profile-3500qps-2026-11-30/gc-*.json": "gc.get_stats() samples beside a profile, no `schema`",
    "generator-clients-2026-11-30/*.json": "`wok.adhoc.generator-clients/1`, gen_clients.py's beside them",
    "lean-worker-2026-12-01/*.json": "`wok.lean_worker/1`, lean_worker.py's beside them",
}


def committed_results() -> list[tuple[str, dict]]:
    """(path from docs/results/, document) of each wok result committed there, in subfolders too (gpu_check's
    are only there): all but NOT_WOK_RESULTS, each of which holds a file."""
    from fnmatch import fnmatch

    out, skipped = [], set()
    for path in sorted(RESULTS.rglob("*.json")):
        name = path.relative_to(RESULTS).as_posix()
        if matched := [pattern for pattern in NOT_WOK_RESULTS if fnmatch(name, pattern)]:
            skipped.update(matched)
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        schema = doc.get("schema") if isinstance(doc, dict) else None
        assert isinstance(schema, str) and schema.startswith("wok."), (
            f"docs/results/{name}: expected a wok result (a `schema` of wok.…), got schema {schema!r}: "
            "name it in NOT_WOK_RESULTS if it is none"
        )
        out.append((name, doc))
    assert skipped == set(NOT_WOK_RESULTS), f"NOT_WOK_RESULTS names no file: {sorted(set(NOT_WOK_RESULTS) - skipped)}"
    return out


def documented_fields(schema: str) -> set[str]:
    """The top-level keys named in the first column of the schema's section's tables."""
    text = DOC.read_text(encoding="utf-8")
    heading = re.search(rf"^### `{re.escape(schema)}`: bench/\w+\.py$", text, re.M)
    assert heading, f"docs/bench-schema.md: no section `### `{schema}`: bench/….py`"
    section = text[heading.end() :]
    section = section[: m.start()] if (m := re.search(r"^#{1,3} ", section, re.M)) else section
    names = set()
    for row in re.findall(r"^\| ([^|]+) \|", section, re.M):
        names.update(n for n in re.findall(r"`([^`]+)`", row) if re.fullmatch(r"\w+", n))
    return names


@pytest.mark.parametrize(("script", "schema"), sorted(SCRIPTS.items()))
def test_each_scripts_schema_has_its_section(script, schema):
    assert f'"{schema}"' in (ROOT / "bench" / f"{script}.py").read_text(encoding="utf-8")
    assert "schema" in documented_fields(schema)


@pytest.mark.parametrize(("script", "schema"), sorted(SCRIPTS.items()))
def test_every_key_of_a_committed_result_is_documented(script, schema):
    """Every committed result of each schema (docs/results/, its subfolders too): its top-level keys. Only the
    top level was read, and only the newest file by `created`: gpu_check's results, in subfolders and
    without `created`, were never checked."""
    found = [(name, doc) for name, doc in committed_results() if doc["schema"] == schema]
    if not found:
        pytest.skip(f"no committed {schema} result")
    documented = documented_fields(schema)
    missing = {name: sorted(set(doc) - documented) for name, doc in found if set(doc) - documented}
    assert not missing, f"keys docs/bench-schema.md does not describe, by file: {missing}"


# The sections a ramp's result gains from --fault and --soak ("The `faults` and `soak` sections"):
# the section's first table is its top level; a table headed `#### `path`` (`faults[]`: each element
# of the array) lists that object's keys.
SECTIONS = {"faults": "wok.faults/1", "soak": "wok.soak/1"}
SERVE = ["--replicas", "1", "--serve-args", "--models mlp --torch-threads 1", "--workers", "1"]
# A server-side fault that runs and ends, and one the server refuses (an `error` event, a `note`).
FAULT_RUN = [*SERVE, "--steps", "20", "--step-duration", "1s", "--warmup", "0.2s"]
FAULT_RUN += ["--fault", "slow:model=mlp,delay=5ms,at=10%,until=50%", "--fault", "fail:model=nosuch,at=70%"]
SOAK_RUN = [*SERVE, "--capacity", "40", "--soak", "1s", "--soak-window", "0.5s", "--rss-every", "0.2s"]


def documented_tables(schema: str) -> dict[str, set[str]]:
    """Path ("" for the section's top level, `faults[]`, `rss`, …) → the names its table documents."""
    text = DOC.read_text(encoding="utf-8")
    heading = re.search(rf"^### `{re.escape(schema)}`: bench/\w+\.py$", text, re.M)
    assert heading, f"docs/bench-schema.md: no section `### `{schema}`: bench/….py`"
    section = text[heading.end() :]
    section = section[: m.start()] if (m := re.search(r"^#{1,3} ", section, re.M)) else section
    parts = re.split(r"^#### `([^`]+)`\s*$", section, flags=re.M)
    tables = {}
    for path, body in zip(["", *parts[1::2]], parts[0::2]):
        names = set()
        for row in re.findall(r"^\| ([^|]+) \|", body, re.M):
            names.update(n for n in re.findall(r"`([^`]+)`", row) if re.fullmatch(r"\w+", n))
        tables[path] = names
    return tables


def walk(obj: dict, tables: dict[str, set[str]], seen: dict[str, set[str]], path: str = "") -> list[str]:
    """The keys of `obj` (at `path`) that its table does not name, and those of the objects in it
    that have a table of their own; every key met is added to `seen`."""
    seen.setdefault(path, set()).update(obj)
    missing = [f"{path}.{k}" if path else k for k in obj if k not in tables[path]]
    for key, value in obj.items():
        sub = f"{path}.{key}" if path else key
        if isinstance(value, dict) and sub in tables:
            missing += walk(value, tables, seen, sub)
        elif isinstance(value, list) and f"{sub}[]" in tables:
            for item in value:
                missing += walk(item, tables, seen, f"{sub}[]")
    return missing


@pytest.fixture(scope="module")
def fresh_sections(tmp_path_factory) -> dict[str, dict]:
    """A real fault run and a real soak, each on a replica of its own, run at once (each is mostly
    a process's imports and a replica's start): key → that run's section."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    def run(key: str, args: list[str], out: Path) -> dict:
        cmd = [sys.executable, "-m", "wok", "bench", "ramp", *args, "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        assert out.exists(), f"{key}: exit {proc.returncode}, no result:\n{proc.stderr[-3000:]}"
        return json.loads(out.read_text(encoding="utf-8"))[key]

    with ThreadPoolExecutor(2) as pool:
        # The folders made here, not in the threads: the first mktemp of a worker makes its base folder, and
        # two at once raced (FileExistsError, where no test before in that worker had used tmp_path).
        runs = {
            key: (args, tmp_path_factory.mktemp(key) / "r.json")
            for key, args in (("faults", FAULT_RUN), ("soak", SOAK_RUN))
        }
        futures = {key: pool.submit(run, key, args, out) for key, (args, out) in runs.items()}
        return {key: f.result() for key, f in futures.items()}


def hand_built(key: str) -> dict:
    """What only rare runs write, from the code that writes it: a fault whose server-side expiry
    came before its end (`expired_s`) and a request never sent (`requests.not_sent`); a soak cut short
    (`cut`, as SoakRamp.step_cut builds it)."""
    import time
    from types import SimpleNamespace

    import numpy as np

    from wok.bench.faults import fault_report, parse_fault
    from wok.bench.soak import SoakRamp, soak_report
    from wok.bench.workers import NOT_SENT

    intended = np.arange(0.0, 4.0, 0.05)
    latency = np.full(len(intended), 0.01)
    codes = np.zeros(len(intended), np.int16)
    if key == "faults":
        spec = parse_fault("slow:model=mlp,delay=5ms,at=1s")
        events = [{"t_s": 1.0, "fault": 0, "action": "slow", "replica": 0, "expires_s": 2.0}]
        args = dict(specs=[spec], events=events, slo_p99_ms=100.0, end_s=4.0, n_replicas=1)
        unsent = (np.array([3.99]), np.array([np.nan]), np.array([np.nan]), np.array([NOT_SENT], np.int16))
        intended, done, latency, codes = (
            np.concatenate(pair) for pair in zip((intended, intended + latency, latency, codes), unsent)
        )
        return fault_report(intended, done, latency, codes, **args)
    ramp = SoakRamp.__new__(SoakRamp)  # step_cut alone: no pool, no server
    ramp._clock0, ramp.timeline = time.monotonic() - 2.0, []  # the soak's first send, 2 s ago
    outcome = SimpleNamespace(sent=intended, done=intended + latency, codes=codes)
    pool = SimpleNamespace(cut=lambda wait_s: [outcome, None])  # a second worker died: nothing back
    ramp.step_cut(pool, [SimpleNamespace(times=intended), None], ramp._clock0, KeyboardInterrupt())
    rss = [(t, [300e6]) for t in (0.5, 1.0, 1.5)]
    return soak_report(intended, latency, codes, rss, duration_s=4.0, window_s=1.0, urls=["u"], cut=ramp.cut)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("key", sorted(SECTIONS))
def test_every_key_of_the_faults_and_soak_sections_is_documented(key, fresh_sections):
    """Each key a real run writes, each key of the committed results' sections (docs/results/**), and
    each key of the rare cases above is in its table; and each name of the tables is written by one."""
    tables = documented_tables(SECTIONS[key])
    seen: dict[str, set[str]] = {}
    sources = {"a real run": fresh_sections[key], "a hand-built case": hand_built(key)}
    for name, doc in committed_results():
        if isinstance(doc.get(key), dict):
            sources[name] = doc[key]
    assert len(sources) > 2, f"no committed result with a {key} section"
    for source, section in sources.items():
        assert section["schema"] == SECTIONS[key]
        missing = walk(section, tables, seen)
        assert not missing, f"{source}: keys docs/bench-schema.md does not describe: {sorted(missing)}"
    never = {f"{path}.{n}" if path else n for path, names in tables.items() for n in names - seen.get(path, set())}
    assert not never, f"docs/bench-schema.md names keys that none of them has: {sorted(never)}"


def test_wok_simulates_config_is_documented():
    """`wok simulate`'s `config` and `config.model` (docs/bench-schema.md, "`wok simulate`'s
    `config`"): the keys of each of its two tables are the keys simulate_ramp writes."""
    from wok.bench.report import to_json
    from wok.bench.simulate import BatcherModel, SimConfig, simulate_ramp

    text = DOC.read_text(encoding="utf-8")
    heading = re.search(r"^#### `wok simulate`'s `config`$", text, re.M)
    assert heading, "docs/bench-schema.md: no section #### `wok simulate`'s `config`"
    section = text[heading.end() :]
    section = section[: re.search(r"^#{1,4} ", section, re.M).start()]
    tables = [
        {n for row in re.findall(r"^\| ([^|]+) \|", block, re.M) for n in re.findall(r"`(\w+)`", row)}
        for block in re.findall(r"(?:^\|.*\n)+", section, re.M)
    ]
    model = BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0)
    config = json.loads(to_json(simulate_ramp(SimConfig(model=model, steps=[50.0], step_duration_s=1.0))))["config"]
    assert tables == [set(config), set(config["model"])]


@pytest.mark.timeout(120)
def test_every_top_level_key_of_a_ramps_result_is_documented(bench_server):
    """A ramp's result (`wok.bench/2`): each top-level key it writes has its row, in "Top level" or,
    for `balancer`, among the sections added by other runs. `devices` was written before it had one."""
    from wok.bench.runner import Ramp, RampConfig

    text = DOC.read_text(encoding="utf-8")
    top = text[text.index("\n## Top level\n") :]
    top = top[: top.index("\n## ", 1)]
    documented = {n for row in re.findall(r"^\| ([^|]+) \|", top, re.M) for n in re.findall(r"`(\w+)`", row)}
    # `balancer` has its row among the sections other runs add.
    documented |= {"balancer"} & set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    cfg = RampConfig(bench_server.target, [("mlp", 1.0)], [20], 0.5, warmup_s=0.1)
    result = Ramp(cfg, progress=lambda line: None).run()
    assert result["devices"] == {"mlp": "cpu"}
    assert not set(result) - documented, f"keys docs/bench-schema.md does not describe: {set(result) - documented}"
