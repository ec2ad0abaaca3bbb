"""The monitoring files in deploy/: valid for Prometheus, and naming only metrics wok exports.

promtool (from Debian's `prometheus` package, which `.ci/run` installs) checks the
Prometheus config, the rule files, the rules' unit tests and every dashboard query. The
series that the rules, the dashboard, the generated autoscaling queries and the unit tests'
input name (metric names, labels, bucket bounds and the label values the server fixes) are
checked against a live scrape of a real server after real traffic; the GPU gauges, absent
where there is no GPU, against what `GpuSampler` collects from a fake NVML.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from wok.codec import encode_request
from wok.metrics import FLUSH_REASONS, LATENCY_BUCKETS, REJECTION_REASONS, STAGES, GpuSampler
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_FILES = sorted(PROMETHEUS.glob("*_rules.yml"))
RULE_TESTS = PROMETHEUS / "alert_rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "wok-dashboard.json"

# Prometheus' own series, not wok's.
PROMETHEUS_SERIES = {"up"}
# The families wok exports with model="" too: requests that name no served model (NOT_FOUND,
# not_found) or do not parse (INVALID_ARGUMENT, invalid). The live scrape below keeps this honest.
MODELLESS_SERIES = {"wok_responses_total", "wok_rejected_requests_total"}
# Whose rates are requests per second (a panel's "reqps"), and batches per second ("ops").
REQUEST_COUNTERS = {
    "wok_responses_total",
    "wok_rejected_requests_total",
    "wok_request_duration_seconds_bucket",
    "wok_request_duration_seconds_count",
    "wok_calls_ended_before_handler_total",  # ModelInfer calls: one request each
}
BATCH_COUNTERS = {"wok_batch_size_bucket", "wok_batch_size_count", "wok_batch_flushes_total", "wok_batch_reruns_total"}
# Values that stand in for the dashboard's Grafana variables when its queries go to promtool.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "model": ".*", "percentile": "99"}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: it comes with Debian's `prometheus` package, which .ci/run installs")
    return path


def run_promtool(promtool: str, *args: str | Path) -> None:
    r = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool {' '.join(map(str, args))}\n{r.stdout}\n{r.stderr}"


# -- what the files say ---------------------------------------------------------------------


def load_rules() -> list[dict]:
    return [
        rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def data_panels(dashboard: dict) -> list[dict]:
    """Every panel but rows (which only group panels), nested ones included."""
    out = []
    for p in dashboard["panels"]:
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def dashboard_exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in data_panels(dashboard) for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    """A dashboard query with its Grafana variables replaced by plausible values."""

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in GRAFANA_VARIABLES, f"unknown Grafana variable ${name} in {expr!r}"
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


# PromQL words that can stand where a metric name could: keywords and operators.
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """Metric (and recording-rule) names in a PromQL expression.

    Strings, label matchers, range/subquery brackets, grouping clauses and Grafana
    variables are blanked first; what remains are identifiers that are metric names,
    function names (followed by `(`) or keywords.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", "{}", e)
    e = re.sub(r"\[[^\]]*\]", "[]", e)
    e = GROUPING.sub(" ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    return {m.group(1) for m in IDENTIFIER.finditer(e)} - PROMQL_KEYWORDS


def test_metric_name_extraction_finds_metrics_and_nothing_else():
    assert metric_names(
        'histogram_quantile(0.99, sum by (model, stage, le) (rate(x_bucket{model=~"$model", le!="1e-3"}[1m])))'
    ) == {"x_bucket"}
    assert metric_names("sum(rate(a_total[5m])) by (code) / ignoring(code) group_left sum(rate(b_total[5m]))") == {
        "a_total",
        "b_total",
    }
    assert metric_names('up{job="wok"} == 0 and on (instance) c offset 5m > 1e-3 unless d') == {"up", "c", "d"}
    assert metric_names("(x or y * 0) / level:rule_name:rate1m") == {"x", "y", "level:rule_name:rate1m"}
    assert metric_names("avg_over_time(g[$__rate_interval]) > bool 2") == {"g"}


GENERATED = ROOT / "deploy" / "k8s" / "generated"


def queries() -> list[tuple[str, str, str]]:
    """Every PromQL query in deploy/ that reads wok's series, as (where, query, legend): the rules, the
    dashboard's panels and variables (a variable's `label_values(SELECTOR, LABEL)` as `SELECTOR` with
    LABEL as its legend), the autoscaling queries `wok plan` writes, and the rules' unit tests' input
    series (selectors too)."""
    out = [(f"rule {r.get('record') or r.get('alert')}", r["expr"], "") for r in load_rules()]
    dashboard = load_dashboard()
    for p in data_panels(dashboard):
        out += [(f"panel {p['title']!r}", t["expr"], t.get("legendFormat", "")) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", query.strip())
            assert m, f"variable {var['name']}: expected label_values(SELECTOR, LABEL), got {query!r}"
            out.append((f"variable {var['name']}", m.group(1), f"{{{{{m.group(2)}}}}}"))
    keda = yaml.safe_load((GENERATED / "keda-scaledobject.yaml").read_text())
    out += [("KEDA trigger", t["metadata"]["query"], "") for t in keda["spec"]["triggers"]]
    adapter = yaml.safe_load(
        yaml.safe_load((GENERATED / "prometheus-adapter-rules.yaml").read_text())["data"]["config.yaml"]
    )
    out += [("adapter seriesQuery", r["seriesQuery"], "") for r in adapter["rules"]]
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        out += [(f"{RULE_TESTS.name} input series", s["series"], "") for s in t.get("input_series", [])]
    return out


def referenced_metric_names() -> dict[str, set[str]]:
    """Each metric name the queries use → where."""
    where: dict[str, set[str]] = {}
    for source, query, _ in queries():
        for n in metric_names(query):
            where.setdefault(n, set()).add(source)
    recorded = {r["record"] for r in load_rules() if "record" in r}
    return {n: srcs for n, srcs in where.items() if n not in recorded and n not in PROMETHEUS_SERIES}


# Labels that Prometheus gives a target (job, instance) or that deploy/'s relabelling adds (namespace,
# pod: prometheus.yml's Kubernetes block, the annotations' `kubernetes-pods` job), not wok.
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
SELECTOR = re.compile(r"(?<![\w:])(wok_\w+)(?![\w:])\s*(\{)?")
MATCHER = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
GROUPING_LABELS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
WORDS = re.compile(r"[\w.+-]+(?:\|[\w.+-]+)*")


def selections(query: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each wok series selector in `query`: its metric and its label matchers (label, operator, value)."""
    out = []
    for m in SELECTOR.finditer(query):
        matchers, pos = [], m.end()
        if m.group(2):
            while (mm := MATCHER.match(query, pos)) is not None:
                matchers.append(mm.groups())
                pos = mm.end()
            assert query[pos:].lstrip().startswith("}"), f"unparsed label matchers in {query!r} at {query[pos:]!r}"
        out.append((m.group(1), matchers))
    return out


def unexported_selections(
    queries: list[tuple[str, str, str]], labels: dict[str, set[str]], values: dict[tuple[str, str], set[str]]
) -> list[str]:
    """What `queries` select that no exported series carries: a label the metric does not have (in a
    matcher, a grouping clause or a legend), or a value outside a label's known set, `values`, for
    labels whose values the server fixes (histogram bounds `le` exactly as exported, status codes,
    reasons, stages). A matcher on either matches no series, and the query stays silent for ever."""
    problems = []
    for where, query, legend in queries:
        metrics = [(metric, matchers) for metric, matchers in selections(query) if metric in labels]
        for metric, matchers in metrics:
            for label, op, value in matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in labels[metric]:
                    problems.append(f"{where}: {metric} has no label {label!r} (it has {sorted(labels[metric])})")
                    continue
                known = values.get((metric, label))
                if known is None or (op in ("=", "!=") and value == ""):
                    continue
                if op in ("=~", "!~"):
                    if "$" in value or not WORDS.fullmatch(value):  # a Grafana variable, or a real regex
                        continue
                    wanted = value.split("|")
                else:
                    wanted = [value]
                for v in wanted:
                    if v not in known:
                        problems.append(
                            f"{where}: {metric}{{{label}{op}{v!r}}}: {v!r} is none a matcher can name: {sorted(known)}"
                        )
        if not metrics:
            continue
        carried = TARGET_LABELS.union(*(labels[metric] for metric, _ in metrics))
        used = {x.strip() for g in GROUPING_LABELS.findall(query) for x in g.split(",") if x.strip()}
        used |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        for label in sorted(used - carried):
            problems.append(
                f"{where}: groups or labels by {label!r}, which none of {sorted(m for m, _ in metrics)} has"
            )
    return problems


def le_matchable(exported: set[str]) -> set[str]:
    """The bucket bounds a matcher such as le="0.2" can name: those the server exports in the form that
    Prometheus 3 stores too. Prometheus 3 rewrites each `le` it ingests as a float (whole numbers with
    ".0": le="1" is stored as le="1.0"), Prometheus 2 keeps it as exported: a bound exported as "1"
    would match in one of them only. wok writes every bound so (as prometheus_client does); the
    scrape test below checks that none is lost here."""
    return {v for v in exported if v == "+Inf" or repr(float(v)) == v}


def test_le_matchable_keeps_the_bounds_both_prometheus_versions_store_alike():
    assert le_matchable({"2.5e-05", "0.0001", "0.2", "1", "1.0", "60", "+Inf"}) == {
        "2.5e-05",
        "0.0001",
        "0.2",
        "1.0",
        "+Inf",
    }


def test_unexported_selections_finds_labels_and_values_no_series_has():
    labels = {"wok_x_bucket": {"model", "le"}, "wok_r_total": {"model", "code"}}
    values = {("wok_x_bucket", "le"): {"0.2", "0.25", "+Inf"}, ("wok_r_total", "code"): {"OK", "INTERNAL"}}
    fine = [
        ("a", 'sum by (model, le) (rate(wok_x_bucket{le="0.2", model=~"$model", job="wok"}[1m]))', "{{model}}"),
        ("b", 'sum by (instance) (wok_r_total{code!="OK", code=~"OK|INTERNAL", model!=""})', ""),
        ("c", 'x{le="0.3"} and on (job) wok_x_bucket{le=~"0\\.2.*"}', ""),  # a regex: not a list of values
        ("d", 'wok_r_total{pod=~"wok-[a-z]{1,10}-x"}', ""),  # braces inside a matcher's string
    ]
    assert unexported_selections(fine, labels, values) == []
    wrong = [
        ("e", 'rate(wok_x_bucket{le="0.3"}[1m])', ""),  # not a bound the server exports
        ("f", 'wok_x_bucket{le="1.0"}', ""),
        ("g", 'wok_r_total{code=~"OK|INTERNL"}', ""),
        ("h", 'wok_r_total{modle="mlp"}', ""),
        ("i", "sum by (model, reason) (wok_r_total)", ""),
        ("j", "wok_r_total", "{{model_instance}}"),
    ]
    problems = unexported_selections(wrong, labels, values)
    assert [p.split(":", 1)[0] for p in problems] == ["e", "f", "g", "h", "i", "j"], problems


# -- promtool -------------------------------------------------------------------------------


def test_the_deploy_readmes_metric_table_lists_every_metric_and_label_value_the_server_exports():
    from wok.metrics import FLUSH_REASONS, REJECTION_REASONS

    def rows(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            if line.startswith("| `wok_"):
                names, rest = line[2:].split(" | ", 1)
                out |= dict.fromkeys(re.findall(r"`(wok_\w+)`", names), rest)
        return out

    documented = rows((ROOT / "docs" / "metrics.md").read_text())
    table = rows((ROOT / "deploy" / "README.md").read_text())
    # Every family the server's collectors define (prometheus_client adds _total to a counter's name).
    source = "".join(p.read_text() for p in (ROOT / "server").glob("*.py"))
    defined = set(re.findall(r'"(wok_\w+)"', source))
    exported = {n if n in documented else f"{n}_total" for n in defined}
    assert sorted(exported - set(documented)) == [], "docs/metrics.md leaves out metrics the server defines"
    assert sorted(set(documented) - set(table)) == []
    label_values = {"wok_batch_flushes_total": FLUSH_REASONS, "wok_rejected_requests_total": REJECTION_REASONS}
    for metric, values in label_values.items():
        missing = [v for v in values if not re.search(rf"\b{v}\b", table[metric])]
        assert not missing, f"deploy/README.md's {metric} row leaves out {missing}"


def test_the_rule_files_are_the_ones_the_config_loads():
    config = yaml.safe_load(CONFIG.read_text())
    assert (
        sorted(config["rule_files"]) == sorted(p.name for p in RULE_FILES) == ["alert_rules.yml", "recording_rules.yml"]
    )
    assert config["global"]["scrape_interval"] == "15s"
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "wok"
    assert job["static_configs"][0]["targets"] == ["localhost:8002"]
    assert not job.get("honor_labels"), "honor_labels would let a scraped label override the target's"


def test_promtool_accepts_the_config(promtool):
    run_promtool(promtool, "check", "config", CONFIG)  # also checks the rule files it loads


def test_promtool_accepts_the_rule_files(promtool):
    run_promtool(promtool, "check", "rules", *RULE_FILES)


def test_the_rules_unit_tests_pass(promtool):
    run_promtool(promtool, "test", "rules", RULE_TESTS)


def seconds(duration: str) -> int:
    m = re.fullmatch(r"(\d+)([smh])", duration)
    assert m, f"expected a duration such as 15s, 1m or 2h, got {duration!r}"
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_the_rules_unit_tests_sample_and_evaluate_as_prometheus_yml_does():
    """The unit tests feed series at the config's scrape interval and evaluate at its evaluation interval:
    at one-minute samples they tested the rules at an interval they are not written for, and passed on
    Prometheus 2's promtool only. Prometheus 3's range selectors leave out the sample at the window's
    start, so a rate(...[1m]) over one-minute samples holds one sample and gives no rate: every alert
    on a rate stayed silent where the tests expected it to fire."""
    config = yaml.safe_load(CONFIG.read_text())["global"]
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["evaluation_interval"] == config["evaluation_interval"]
    intervals = [t["interval"] for t in tests["tests"]]
    assert set(intervals) == {config["scrape_interval"]}, intervals


def test_every_range_in_the_rules_holds_four_scrapes():
    """prometheus.yml's promise: rate() needs two samples, and four leave room for a missed scrape and
    for Prometheus 3's left-open ranges (a 1m range at 15 s holds 4 samples there, 5 in Prometheus 2)."""
    scrape = seconds(yaml.safe_load(CONFIG.read_text())["global"]["scrape_interval"])
    ranges = {(r.get("record") or r["alert"], w) for r in load_rules() for w in re.findall(r"\[(\w+)\]", r["expr"])}
    assert ranges, "no range found: the pattern is wrong"
    short = sorted((name, w) for name, w in ranges if seconds(w) < 4 * scrape)
    assert not short, f"ranges shorter than 4 scrapes of {scrape} s: {short}"


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    exprs = dashboard_exprs(load_dashboard())
    rules = [{"record": f"dashboard:query_{i}:check", "expr": grafana_to_promql(e)} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", path)


# -- the rules ------------------------------------------------------------------------------


def test_a_stacked_panel_of_per_model_means_repeats_by_model():
    """Rates add up across models (a stack of them is the total); means do not: stacked across
    models, the bands of several models' means add up to no model's mean."""
    for panel in data_panels(load_dashboard()):
        stacking = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {})
        means = [t["expr"] for t in panel.get("targets", []) if re.search(r"by \([^)]*\bmodel\b", t["expr"])]
        if stacking.get("mode", "none") != "none" and any("/" in e for e in means):
            assert panel.get("repeat") == "model", f"panel {panel['title']!r} stacks every model together"


def test_no_rule_takes_a_quantile_of_the_batch_size():
    """Its buckets are powers of two: histogram_quantile interpolates inside one (full batches of 32
    read as 24, batches of one row as 0.5), so no rule or panel should report one."""
    exprs = [r["expr"] for r in load_rules()] + dashboard_exprs(load_dashboard())
    assert not [e for e in exprs if "histogram_quantile" in e and "wok_batch_size_bucket" in e]


def test_recording_rules_follow_level_metric_operations_naming():
    records = [r["record"] for r in load_rules() if "record" in r]
    assert len(records) == len(set(records))
    for name in records:
        level, metric, ops = name.split(":")
        assert re.fullmatch(r"[a-z_]+", level) and metric.startswith("wok_") and re.fullmatch(r"[a-z0-9_]+", ops), name
    for must in (
        "model_stage:wok_request_stage_duration_seconds:p50_1m",
        "model_stage:wok_request_stage_duration_seconds:p95_1m",
        "model_stage:wok_request_stage_duration_seconds:p99_1m",
        "model:wok_request_duration_seconds:p99_1m",
        "model_code:wok_responses:rate1m",
        "model:wok_responses:success_ratio_rate1m",
        "model:wok_batch_size:mean_1m",
        "model_instance:wok_instance_busy_seconds:rate1m",
        "model_reason:wok_rejected_requests:rate1m",
    ):
        assert must in records


def test_every_alert_has_a_severity_and_annotations_that_name_its_labels():
    alerts = {r["alert"]: r for r in load_rules() if "alert" in r}
    assert {
        "WokDown",
        "WokTargetsMissing",
        "WokLatencyP99AboveSLO",
        "WokQueueSaturated",
        "WokRequestsRejected",
        "WokClientRequestsRejected",
        "WokGpuTemperatureHigh",
        "WokGpuLost",
    } <= set(alerts)
    for name, a in alerts.items():
        assert a["labels"]["severity"] in ("critical", "warning", "info"), name
        assert a.get("for"), name
        assert "$labels" in a["annotations"]["summary"], name
        assert a["annotations"]["description"].strip(), name
    assert 'reason!~"invalid|not_found"' in alerts["WokRequestsRejected"]["expr"]
    # The SLO is a bound of the latency buckets, so the share of requests over it is exact.
    slo = alerts["WokLatencyP99AboveSLO"]["expr"]
    assert 'le="0.2"' in slo and "> 0.01" in slo and 0.2 in LATENCY_BUCKETS


# -- the dashboard --------------------------------------------------------------------------


def test_the_dashboard_has_its_variables_and_every_panel_a_query():
    d = load_dashboard()
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["multi"] and model["includeAll"]
    assert model["datasource"]["uid"] == "${datasource}"

    ids = [p["id"] for p in d["panels"]] + [q["id"] for p in d["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in d["panels"]:
        if p["type"] == "row":
            assert not p.get("targets"), p["title"]
    panels = data_panels(d)
    assert len(panels) >= 10
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t.get("datasource", p["datasource"]) == p["datasource"], p["title"]
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert heatmaps and all(t["format"] == "heatmap" for p in heatmaps for t in p["targets"])
    assert any("wok_request_duration_seconds_bucket" in t["expr"] for p in heatmaps for t in p["targets"])


def panel_units(panel: dict) -> set[str]:
    """The panel's value units: a time series' field unit, a heatmap's cell unit."""
    units = {panel.get("fieldConfig", {}).get("defaults", {}).get("unit")}
    units.add(panel.get("options", {}).get("cellValues", {}).get("unit"))
    return units - {None}


def test_a_panel_counts_requests_per_second_only_of_requests():
    batch_panels = []
    for p in data_panels(load_dashboard()):
        names = set().union(*(metric_names(t["expr"]) for t in p["targets"]))
        units = panel_units(p)
        if "reqps" in units:
            assert names <= REQUEST_COUNTERS, (
                f"panel {p['title']!r} is in requests/s but counts {names - REQUEST_COUNTERS}"
            )
        if names and names <= BATCH_COUNTERS:
            assert units == {"ops"}, f"panel {p['title']!r} counts batches per second: expected unit ops, got {units}"
            batch_panels.append(p["title"])
    assert {"Batch size distribution", "Batch flushes/s by reason"} <= set(batch_panels)


def selectors(expr: str, metric: str) -> list[str]:
    """The label matchers of each use of `metric` in `expr` ("" where it has none)."""
    return [m.group(1) or "" for m in re.finditer(rf"(?<![\w:]){metric}(?![\w:])\s*(\{{[^}}]*\}})?", expr)]


def test_selectors_finds_each_use_of_a_metric():
    e = 'sum by (model) (rate(x_total{model=~"$model", model!=""}[1m])) / sum(rate(x_total[1m])) + y_x_total{a="b"}'
    assert selectors(e, "x_total") == ['{model=~"$model", model!=""}', ""]


def test_no_per_model_ratio_counts_requests_that_name_no_model():
    """Requests naming no served model are counted with model="": a ratio summed by model over them
    makes a series with no model label (the success ratio: a nameless line at 0 %). Per-model rates
    (requests/s by code, rejections) keep them on purpose: they are traffic, and the client's errors."""
    exprs = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in load_rules()]
    exprs += [(f"panel {p['title']!r}", t["expr"]) for p in data_panels(load_dashboard()) for t in p["targets"]]
    checked = set()
    for where, expr in exprs:
        if "/" not in expr or not re.search(r"\bby\s*\([^)]*\bmodel\b", expr):
            continue
        for metric in MODELLESS_SERIES:
            for sel in selectors(expr, metric):
                assert re.search(r'\bmodel\s*!=\s*""', sel), (
                    f'{where}: {metric}{sel} leaves in model="" in a ratio by model'
                )
                checked.add(where)
    assert {"rule model:wok_responses:success_ratio_rate1m", "panel 'Success ratio'"} <= checked


def test_the_dashboard_works_without_the_recording_rules():
    recorded = {r["record"] for r in load_rules() if "record" in r}
    for expr in dashboard_exprs(load_dashboard()):
        assert not metric_names(expr) & recorded, expr


def ratio_or_quantile(expr: str) -> bool:
    """A query that divides by a rate, or takes a histogram quantile: NaN (0/0) over a window without requests."""
    return "histogram_quantile" in expr or re.search(r"\)\s*/\s*\(?\s*sum\b", expr) is not None


def test_no_dashboard_ratio_or_quantile_draws_nan_where_no_request_was_seen(promtool, tmp_path):
    """An idle model, and `h2d` of a model served on the CPU (exported at a count of 0), have no
    request in the window: a mean, ratio or quantile over them must be no series, not NaN, which
    Prometheus returns for 0/0 and histogram_quantile of zero rates (legend means and the stacked
    stage means turn NaN with it)."""
    flat = "5x40"  # 10 minutes of scrapes every 15 s
    series = []
    for stage in ("queue", "h2d"):
        labels = f'job="wok",instance="a:8002",model="idle",stage="{stage}"'
        series += [f"wok_request_stage_duration_seconds_{k}{{{labels}}}" for k in ("sum", "count")]
        series += [f'wok_request_stage_duration_seconds_bucket{{{labels},le="{le}"}}' for le in ("0.001", "+Inf")]
    model = 'job="wok",instance="a:8002",model="idle"'
    for family in ("wok_request_duration_seconds", "wok_batch_size"):
        series += [f"{family}_{k}{{{model}}}" for k in ("sum", "count")]
        series += [f'{family}_bucket{{{model},le="{le}"}}' for le in ("0.2", "+Inf")]
    series += [f'wok_responses_total{{{model},code="{code}"}}' for code in ("OK", "INTERNAL")]
    queries = {}
    for p in data_panels(load_dashboard()):
        for t in p["targets"]:
            if ratio_or_quantile(t["expr"]) and "wok_event_loop_lag_seconds" not in t["expr"]:
                queries[f"{p['title']} {t['refId']}"] = grafana_to_promql(t["expr"])
    assert {"Success ratio A", "Mean batch size and batches/s A", "End-to-end latency P50 / P95 / P99 C"} <= set(
        queries
    ), sorted(queries)
    assert any(k.startswith("Mean time per stage") for k in queries)
    assert any(k.startswith("Stage latency") for k in queries)
    path = tmp_path / "dashboard_nan_test.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(PROMETHEUS / "recording_rules.yml")],
                "evaluation_interval": "15s",
                "tests": [
                    {
                        "interval": "15s",
                        "input_series": [{"series": s, "values": flat} for s in series],
                        "promql_expr_test": [
                            {"expr": q, "eval_time": "5m", "exp_samples": []} for q in queries.values()
                        ],
                    }
                ],
            }
        )
    )
    run_promtool(promtool, "test", "rules", path)


def series_values(scrapes: list, names) -> dict[str, list[str]]:
    """promtool's input series of the samples named `names` in real scrapes, one value per scrape
    ("_" where a scrape had none), labelled as Prometheus would with job="wok"."""
    values: dict[str, list[str]] = {}
    for i, samples in enumerate(scrapes):
        for s in samples:
            if s.name in names:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted((s.labels | {"job": "wok"}).items()))
                values.setdefault(f"{s.name}{{{labels}}}", ["_"] * len(scrapes))[i] = f"{s.value:g}"
    return values


def run_promql_tests(promtool, path: Path, values: dict[str, list[str]], evals: list[dict]) -> None:
    """`promtool test rules` of `evals` over `values`, scraped every 15 s."""
    test = {
        "interval": "15s",
        "input_series": [{"series": k, "values": " ".join(v)} for k, v in values.items()],
        "promql_expr_test": evals,
    }
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": [test]}))
    run_promtool(promtool, "test", "rules", path)


async def test_errors_and_rejections_draw_no_line_for_a_series_that_never_moved(serve, promtool, tmp_path):
    """wok exports its model="" NOT_FOUND and INVALID_ARGUMENT answers, and each model's rejections by
    every reason, at 0 from the start: "Errors and rejections/s" drew a flat line at 0 for each code
    of model="" (its rejections had `> 0`). The input is a real server's scrapes every 15 s, idle,
    then with requests for a model it does not serve: errors with model="" that the panel must draw."""
    (panel,) = [p for p in data_panels(load_dashboard()) if p["title"] == "Errors and rejections/s"]
    queries = {t["refId"]: grafana_to_promql(t["expr"]) for t in panel["targets"]}
    assert sorted(queries) == ["A", "B", "C"]  # C: calls ended before the handler, exported at 0 too
    scrapes = []
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for i in range(12):
                for _ in range(15 if i >= 6 else 0):  # 1/s from the seventh scrape on
                    with pytest.raises(grpc.aio.AioRpcError):
                        await stub.ModelInfer(encode_request("nope", {"INPUT0": np.ones((1, 256), np.float32)}))
                scrapes.append(await asyncio.to_thread(scrape_samples, server.http.port))
    values = series_values(scrapes, MODELLESS_SERIES | {"wok_calls_ended_before_handler_total"})
    assert values['wok_responses_total{code="INVALID_ARGUMENT",job="wok",model=""}'] == ["0"] * 12
    assert values['wok_calls_ended_before_handler_total{job="wok",method="ModelInfer"}'] == ["0"] * 12
    # model="" is no label at all to Prometheus: the legend reads " NOT_FOUND", " rejected: not_found".
    moved = [{"labels": '{code="NOT_FOUND"}', "value": 1}, {"labels": '{reason="not_found"}', "value": 1}]
    evals = [
        # Idle: every series is at 0.
        *({"expr": q, "eval_time": "75s", "exp_samples": []} for q in queries.values()),
        # 15 requests a scrape: 1/s, over a window that holds only scrapes after they began.
        {"expr": queries["A"], "eval_time": "165s", "exp_samples": moved[:1]},
        {"expr": queries["B"], "eval_time": "165s", "exp_samples": moved[1:]},
        {"expr": queries["C"], "eval_time": "165s", "exp_samples": []},  # every call reached the handler
    ]
    run_promql_tests(promtool, tmp_path / "dashboard_errors_test.yml", values, evals)


async def test_requests_by_status_code_draw_only_codes_answered_in_the_range_and_those_without_holes(
    serve, promtool, tmp_path
):
    """wok exports its model="" NOT_FOUND and INVALID_ARGUMENT answers at 0 from the start: the stacked
    "Requests/s by status code" drew a flat band at 0 for each. `> 0` alone would hide them, but
    also every point where a code that was answered is at 0, holes in the stack: a code answered
    in the range is drawn at every point. The input is a real server's scrapes every 15 s: idle,
    then 1/s to a served model and 1/s to one it does not serve, then idle again."""
    (panel,) = [p for p in data_panels(load_dashboard()) if p["title"] == "Requests/s by status code"]
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (target,) = panel["targets"]
    query = grafana_to_promql(target["expr"])
    scrapes = []
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = {"INPUT0": np.ones((1, 256), np.float32)}
            for i in range(24):
                for _ in range(15 if 6 <= i < 12 else 0):  # before the seventh to the twelfth scrape
                    await stub.ModelInfer(encode_request("mlp", x))
                    with pytest.raises(grpc.aio.AioRpcError):
                        await stub.ModelInfer(encode_request("nope", x))
                scrapes.append(await asyncio.to_thread(scrape_samples, server.http.port))
    values = series_values(scrapes, {"wok_responses_total"})
    assert values['wok_responses_total{code="INVALID_ARGUMENT",job="wok",model=""}'] == ["0"] * 24
    assert values['wok_responses_total{code="OK",job="wok",model="mlp"}'][5:8] == ["_", "15", "30"]

    def drawn(rate: int) -> list[dict]:
        return [{"labels": '{code="NOT_FOUND"}', "value": rate}, {"labels": '{code="OK",model="mlp"}', "value": rate}]

    evals = [
        # Idle: nothing answered in the range, though model="" is exported at 0.
        {"expr": query, "eval_time": "75s", "exp_samples": []},
        # 1/s each, over a window that holds only scrapes after they began.
        {"expr": query, "eval_time": "165s", "exp_samples": drawn(1)},
        # Idle again for more than the rate's window: 0, drawn, not a hole.
        {"expr": query, "eval_time": "345s", "exp_samples": drawn(0)},
    ]
    run_promql_tests(promtool, tmp_path / "dashboard_status_codes_test.yml", values, evals)


def test_the_gpu_panels_say_why_they_are_empty_without_a_gpu():
    """The wok_gpu_* series are absent, not 0, where NVML finds no device: each GPU panel says so
    instead of Grafana's bare "No data"."""
    gpu_panels = [
        p
        for p in data_panels(load_dashboard())
        if all(n.startswith("wok_gpu_") for t in p["targets"] for n in metric_names(t["expr"]))
    ]
    assert len(gpu_panels) >= 4
    for p in gpu_panels:
        no_value = p.get("fieldConfig", {}).get("defaults", {}).get("noValue", "")
        assert "GPU" in no_value, f"panel {p['title']!r} shows a bare 'No data' on a CPU-only server"


# -- the names against what wok exports ------------------------------------------------------


class FakeNvml:
    """What GpuSampler calls of pynvml, with plausible readings."""

    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=40, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=1 << 30, total=80 << 30, free=79 << 30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 55

    def nvmlDeviceGetPowerUsage(self, handle):
        return 250_000  # milliwatts

    def nvmlShutdown(self):
        pass


def gpu_sample_names() -> set[str]:
    families = list(GpuSampler(FakeNvml(), ["gpu0"]).collect())
    for f in families:
        # A read the fake cannot answer is skipped silently, which would hide a renamed call.
        assert [s.labels for s in f.samples] == [{"gpu": "0"}], f"{f.name}: the fake NVML lacks what it reads"
    return {s.name for f in families for s in f.samples}


def scrape_samples(port: int) -> list:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [s for f in text_string_to_metric_families(body) for s in f.samples]


async def test_every_metric_the_rules_and_dashboard_use_is_exported(serve):
    async with serve(models=("mlp", "recsys", "encoder")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            await asyncio.gather(
                stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})),
                stub.ModelInfer(
                    encode_request("recsys", {"dense": np.ones((1, 13), np.float32), "ids": np.arange(7)[None]})
                ),
                stub.ModelInfer(encode_request("encoder", {"tokens": np.arange(9)[None]})),
            )
            with pytest.raises(grpc.aio.AioRpcError):  # wrong shape: counted as rejected, invalid
                await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((1, 3), np.float32)}))
            with pytest.raises(grpc.aio.AioRpcError):  # no such model: counted with model=""
                await stub.ModelInfer(encode_request("nope", {"INPUT0": np.ones((1, 256), np.float32)}))
            await server.loop_lag.wait_samples(1)  # the loop-lag family appears with its first sample
            samples = await asyncio.to_thread(scrape_samples, server.http.port)

    live = {s.name for s in samples}
    # The ratio check above (test_no_per_model_ratio_counts_requests_that_name_no_model) covers these.
    assert {s.name for s in samples if s.labels.get("model") == ""} == MODELLESS_SERIES

    gpu = gpu_sample_names()
    assert gpu == {
        "wok_gpu_utilization_ratio",
        "wok_gpu_memory_used_bytes",
        "wok_gpu_memory_total_bytes",
        "wok_gpu_temperature_celsius",
        "wok_gpu_power_watts",
    }
    exported = live | gpu
    referenced = referenced_metric_names()
    # The extraction must have found the families the files are about, or this test proves nothing.
    assert {
        "wok_request_stage_duration_seconds_bucket",
        "wok_request_duration_seconds_bucket",
        "wok_responses_total",
        "wok_rejected_requests_total",
        "wok_batch_size_sum",
        "wok_batch_size_count",
        "wok_batch_flushes_total",
        "wok_instance_busy_seconds_total",
        "wok_queue_depth",
        "wok_inflight_batches",
        "wok_device_lost",
        "wok_gpu_temperature_celsius",
    } <= set(referenced)
    missing = {n: sorted(srcs) for n, srcs in referenced.items() if n not in exported}
    assert not missing, f"referenced but not exported: {missing}"

    # Their labels and label values too: a matcher on a label the series lacks, or on a value it never
    # takes (a bucket bound it does not export, a misspelt code), matches nothing and is as silent.
    every = samples + [s for f in GpuSampler(FakeNvml(), ["gpu0"]).collect() for s in f.samples]
    labels: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for s in every:
        labels.setdefault(s.name, set()).update(s.labels)
        if "le" in s.labels:
            values.setdefault((s.name, "le"), set()).add(s.labels["le"])
    assert {k: le_matchable(v) for k, v in values.items()} == values
    for name in labels:  # the label values the server fixes, whether or not this traffic met them
        if name == "wok_responses_total":
            values[name, "code"] = {c.name for c in grpc.StatusCode}
        elif name == "wok_rejected_requests_total":
            values[name, "reason"] = set(REJECTION_REASONS)
        elif name == "wok_batch_flushes_total":
            values[name, "reason"] = set(FLUSH_REASONS)
        elif name.startswith("wok_request_stage_duration_seconds"):
            values[name, "stage"] = set(STAGES)
    assert values["wok_request_duration_seconds_bucket", "le"] >= {"0.2", "0.25", "+Inf"}
    assert unexported_selections(queries(), labels, values) == []


def test_a_stacked_panel_stacks_one_metrics_series_only():
    """A stack adds its series up: "Batch flushes/s" stacked reruns (forwards run on parts of a failed
    batch) on the flushes, a band of a height no count has. A target of other metrics than the first
    target's is taken out of the stack by an override of its refId."""
    for panel in data_panels(load_dashboard()):
        field = panel.get("fieldConfig", {})
        if field.get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode", "none") == "none":
            continue
        unstacked = {
            o["matcher"]["options"]
            for o in field.get("overrides", [])
            if o.get("matcher", {}).get("id") == "byFrameRefID"
            and any(p["id"] == "custom.stacking" and p["value"].get("mode") == "none" for p in o["properties"])
        }
        first, *others = panel["targets"]
        for t in others:
            if metric_names(t["expr"]) != metric_names(first["expr"]):
                assert t["refId"] in unstacked, f"panel {panel['title']!r} stacks {t['expr']!r} on {first['expr']!r}"
