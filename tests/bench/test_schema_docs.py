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
    "latency_breakdown": "wok.latency_breakdown/1",
    "linear_kernels": "wok.linear_kernels/1",
    "metrics_overhead": "wok.metrics_overhead/1",
    "queue_memory": "wok.queue_memory/1",
    "refusal_cost": "wok.refusal_cost/1",
    "stream_vs_unary": "wok.stream_vs_unary/1",
    "thread_sizing": "wok.thread_sizing/1",
}


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
    """The newest committed result of each schema (docs/results/): its top-level keys."""
    found = []
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("schema") == schema:
            found.append((doc.get("created", ""), path, doc))
    if not found:
        pytest.skip(f"no committed {schema} result")
    _, path, doc = max(found, key=lambda f: f[0])
    missing = set(doc) - documented_fields(schema)
    assert not missing, f"{path.name}: keys docs/bench-schema.md does not describe: {sorted(missing)}"
