"""deploy/k8s and deploy/Dockerfile: the schema, and the facts the manifests must agree on.

Every manifest passes kubernetes-validate's offline schema check (strict: unknown fields
are errors) for Kubernetes 1.30, the oldest version these files are written for (1.33 for
what `wok plan` wrote into generated/), and for the newest the installed kubernetes-validate
knows. Beyond the schema: the probes reach the
port `wok serve` listens on and ask for a health service wok registers, the termination
grace period covers wok's drain, the Services and the budget select the server pods (and
not the bench pods), the bench Job's parts add up to the intended ramp, and the model
repository in the ConfigMap loads and serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import grpc
import kubernetes_validate
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
OLDEST_KUBERNETES = "1.30.0"
# What `wok plan --manifests deploy/k8s/generated/` wrote: its HPA sets per-direction
# tolerances, fields Kubernetes has from 1.33 on (docs/plan.md).
GENERATED = K8S / "generated"
OLDEST_FOR_GENERATED = "1.33.0"
# The command in deploy/k8s/generated/README.md.
PLAN_ARGS = [
    "plan", "--peak-qps", "5000", "--t-batch", "20ms", "--batch-size", "16", "--target-util", "0.65",
    "--redundancy", "1", "--deployment", "wok", "--namespace", "wok", "--model", "mlp",
]  # fmt: skip
KUBERNETES_VERSIONS = [OLDEST_KUBERNETES, OLDEST_FOR_GENERATED, kubernetes_validate.latest_version()]
# Custom resources that kubernetes-validate has no schema for: the KEDA ScaledObject, which
# tests/bench/test_plan.py checks against KEDA's own CRD schema.
CUSTOM_KINDS = {"ScaledObject"}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# -- reading the files -------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def load_all(generated: bool = False) -> list[tuple[Path, dict]]:
    """Every object in the manifests; those `wok plan` generated only when asked."""
    return [
        (p, doc)
        for p in manifest_files()
        if generated or GENERATED not in p.parents
        for doc in yaml.safe_load_all(p.read_text())
        if doc
    ]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def one(kind: str, name: str) -> dict:
    found = [d for _, d in load_all() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(pod_spec: dict, name: str) -> dict:
    (c,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it in command and args ($$ escapes; unknown stays)."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def parse_serve(args: list[str]) -> argparse.Namespace:
    """The container's args through `wok serve`'s own parser."""
    from wok.__main__ import _serve_parser

    parser = argparse.ArgumentParser(prog="wok", exit_on_error=False)
    _serve_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(args)
    assert ns.command == "serve"
    return ns


def parse_bench(args: list[str]) -> argparse.Namespace:
    """The container's args through `wok bench ramp`'s own parser."""
    from wok.bench.cli import add_parser

    parser = argparse.ArgumentParser(prog="wok", exit_on_error=False)
    add_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(args)
    assert (ns.command, ns.bench_command) == ("bench", "ramp")
    return ns


def server_parts() -> tuple[dict, dict, argparse.Namespace]:
    deployment = one("Deployment", "wok")
    spec = deployment["spec"]["template"]["spec"]
    c = container(spec, "wok")
    assert c["command"] == ["wok"]
    return deployment, c, parse_serve(c["args"])


def port_number(c: dict, port) -> int:
    """A container port given by number or by name."""
    if isinstance(port, int):
        assert port in {p["containerPort"] for p in c["ports"]}, f"port {port} is not a container port"
        return port
    (p,) = [p for p in c["ports"] if p.get("name") == port]
    return p["containerPort"]


def pod_spec(doc: dict) -> dict | None:
    """The pod spec of a Deployment, a Job or a Pod; None for other kinds."""
    if doc["kind"] in ("Deployment", "Job"):
        return doc["spec"]["template"]["spec"]
    return doc["spec"] if doc["kind"] == "Pod" else None


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def materialize_repository(root: Path) -> Path:
    """The ConfigMap's model repository as the Deployment's volume lays it out."""
    deployment, c, args = server_parts()
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(args.model_repository)]
    source = volumes[mount["name"]]["configMap"]
    data = one("ConfigMap", source["name"])["data"]
    for item in source["items"]:
        path = root / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[item["key"]])
    return root


def repository_models() -> list[str]:
    _, c, args = server_parts()
    if args.model_repository is None:
        from wok.__main__ import _demo_models

        return list(_demo_models(args))
    deployment = one("Deployment", "wok")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(args.model_repository)]
    return sorted({item["path"].split("/")[0] for item in volumes[mount["name"]]["configMap"]["items"]})


# -- the schema --------------------------------------------------------------------------------


def test_the_manifests_are_where_the_docs_say():
    names = {p.relative_to(K8S).as_posix() for p in manifest_files()}
    assert {
        "00-namespace.yaml",
        "05-models-configmap.yaml",
        "10-deployment.yaml",
        "20-service-headless.yaml",
        "21-service-metrics.yaml",
        "30-pdb.yaml",
        "bench/00-results-pvc.yaml",
        "bench/10-ramp-job.yaml",
        "bench/20-merge-job.yaml",
        "bench/30-results-pod.yaml",
    } <= names
    # The autoscaling comes from `wok plan`, never written by hand.
    assert {
        "generated/hpa.yaml",
        "generated/keda-scaledobject.yaml",
        "generated/prometheus-adapter-rules.yaml",
    } <= names
    assert not [p for p, d in load_all() if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_passes_the_kubernetes_schema(version):
    checked = 0
    for path, doc in load_all(generated=True):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        if GENERATED in path.parents and version_key(version) < version_key(OLDEST_FOR_GENERATED):
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{path.relative_to(ROOT)} ({doc['kind']} {doc['metadata']['name']}), Kubernetes {version}: {exc}"
            )
        checked += 1
    assert checked >= (10 if version == OLDEST_KUBERNETES else 12)


def test_the_schema_check_catches_what_matters_here():
    """Strict validation rejects a misspelt field and a named port in a gRPC probe."""
    deployment = one("Deployment", "wok")
    kubernetes_validate.validate(deployment, OLDEST_KUBERNETES, strict=True)
    spec = deployment["spec"]["template"]["spec"]
    misspelt = {**deployment, "spec": {**deployment["spec"], "template": {**deployment["spec"]["template"]}}}
    misspelt["spec"]["template"]["spec"] = {
        **{k: v for k, v in spec.items() if k != "terminationGracePeriodSeconds"},
        "terminationGracePeriod": 45,
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, OLDEST_KUBERNETES, strict=True)
    c = container(spec, "wok")
    named = {**c, "readinessProbe": {**c["readinessProbe"], "grpc": {"port": "grpc"}}}
    named_port = {**deployment, "spec": {**deployment["spec"], "template": {**deployment["spec"]["template"]}}}
    named_port["spec"]["template"]["spec"] = {**spec, "containers": [named]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(named_port, OLDEST_KUBERNETES, strict=True)


def test_every_namespaced_object_is_in_the_wok_namespace():
    for path, doc in load_all():
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == "wok"
        else:
            assert doc["metadata"].get("namespace") == "wok", f"{path.name}: {doc['kind']} {doc['metadata']['name']}"


# -- the server --------------------------------------------------------------------------------


def test_the_probes_ask_wok_health_on_the_port_wok_serve_listens_on():
    from wok.app import SERVICE_NAME

    _, c, args = server_parts()
    assert args.host == "0.0.0.0", "probes and clients come from outside the pod"
    grpc_port = port_number(c, "grpc")
    assert grpc_port == args.port == 8001
    registered = {"", SERVICE_NAME, *repository_models()}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]
        assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, kind
        assert probe["grpc"]["port"] == args.port, kind
        assert probe["grpc"].get("service", "") in registered, f"{kind}: wok registers only {registered}"


def test_the_termination_grace_period_covers_the_prestop_sleep_and_wok_drain():
    deployment, c, args = server_parts()
    spec = deployment["spec"]["template"]["spec"]
    tgps = spec["terminationGracePeriodSeconds"]
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    pre_stop = float(command[1])
    # server/app.py: past the grace deadline the answers get ANSWER_WINDOW_S to be written, the
    # gRPC stop takes at most 0.1 s and each model's executor shutdown at most 1 s; 5 s more for
    # the interpreter's exit.
    from wok.app import ANSWER_WINDOW_S

    worst = pre_stop + args.grace_period + ANSWER_WINDOW_S + 0.1 + 1.0 * len(repository_models())
    assert tgps > args.grace_period
    assert tgps >= worst + 5, f"terminationGracePeriodSeconds {tgps} < {worst} + 5"
    # Before the endpoints and DNS have let go of the pod, it must still serve: a sleep of at
    # least CoreDNS' 5 s record TTL.
    assert pre_stop >= 5


def test_liveness_cannot_restart_a_draining_server():
    deployment, c, _ = server_parts()
    live = c["livenessProbe"]
    tgps = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert live["periodSeconds"] * live["failureThreshold"] > tgps
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 120


def test_one_gpu_and_torch_threads_within_the_cpu_request():
    _, c, args = server_parts()
    res = c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 1
    assert "cpu" not in res["limits"], "a CPU limit throttles the server in bursts"
    assert res["requests"]["memory"] == res["limits"]["memory"]
    assert args.torch_threads is not None and args.torch_threads <= int(res["requests"]["cpu"])


def test_metrics_port_agrees_everywhere():
    deployment, c, args = server_parts()
    assert args.metrics_host == "0.0.0.0", "wok binds /metrics to loopback unless told"
    metrics_port = port_number(c, "metrics")
    assert args.metrics_port == metrics_port == 8002
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    svc = one("Service", "wok-metrics")
    (p,) = svc["spec"]["ports"]
    assert port_number(c, p["targetPort"]) == metrics_port
    assert "prometheus.io/scrape" not in svc["metadata"].get("annotations", {}), "each pod would be scraped twice"


def test_the_services_and_the_budget_select_the_server_pods_and_only_them():
    deployment, c, args = server_parts()
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    bench_labels = [d["spec"]["template"]["metadata"]["labels"] for _, d in load_all() if d["kind"] == "Job"] + [
        d["metadata"]["labels"] for _, d in load_all() if d["kind"] == "Pod"
    ]
    assert bench_labels
    headless = one("Service", "wok-headless")
    selectors = [
        deployment["spec"]["selector"]["matchLabels"],
        headless["spec"]["selector"],
        one("Service", "wok-metrics")["spec"]["selector"],
        one("PodDisruptionBudget", "wok")["spec"]["selector"]["matchLabels"],
    ]
    for sel in selectors:
        assert selects(sel, pod_labels)
        for labels in bench_labels:
            assert not selects(sel, labels), f"{sel} would select bench pods {labels}"
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses", False)
    (p,) = headless["spec"]["ports"]
    assert port_number(c, p["targetPort"]) == args.port
    assert p["port"] == args.port, "clients dial dns:///wok-headless…:PORT straight to the pods"


def test_the_container_is_locked_down_and_has_a_writable_tmp():
    pods = [(path, pod_spec(doc)) for path, doc in load_all() if pod_spec(doc) is not None]
    assert len(pods) == 4
    for path, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True, path.name
        assert pod["automountServiceAccountToken"] is False, path.name
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, path.name
            assert sc["capabilities"]["drop"] == ["ALL"], path.name
            if c["command"][0] in ("wok", "/bin/sh"):
                assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, f"{path.name}: HOME=/tmp must be writable"


def test_the_generated_autoscaling_scales_this_deployment_on_a_model_it_serves():
    deployment = one("Deployment", "wok")
    meta = deployment["metadata"]
    target = {"apiVersion": deployment["apiVersion"], "kind": "Deployment", "name": meta["name"]}
    generated = [d for p, d in load_all(generated=True) if GENERATED in p.parents]
    (hpa,) = [d for d in generated if d["kind"] == "HorizontalPodAutoscaler"]
    (scaled,) = [d for d in generated if d["kind"] == "ScaledObject"]
    for d in (hpa, scaled):
        assert d["metadata"]["namespace"] == meta["namespace"]
        assert d["spec"]["scaleTargetRef"] == target
    assert hpa["spec"]["minReplicas"] >= deployment["spec"]["replicas"]
    (rules,) = [d for d in generated if d["kind"] == "ConfigMap"]
    (rule,) = yaml.safe_load(rules["data"]["config.yaml"])["rules"]
    (metric,) = hpa["spec"]["metrics"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    (model,) = re.findall(r'model="([^"]+)"', rule["seriesQuery"])
    assert model in repository_models(), f"the HPA follows model {model!r}, which the Deployment does not serve"


def test_the_generated_manifests_are_what_wok_plan_writes_now(tmp_path):
    readme = " ".join((GENERATED / "README.md").read_text().replace("\\\n", " ").split())
    assert f"wok {' '.join(PLAN_ARGS)} --manifests deploy/k8s/generated/" in readme
    out = subprocess.run(
        [sys.executable, "-m", "wok", *PLAN_ARGS, "--manifests", str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in GENERATED.glob("*.yaml"))
    for name in written:
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), (
            f"regenerate {name}: the README says how"
        )


def test_the_hpa_and_the_readme_say_which_kubernetes_it_needs_and_what_an_older_one_does():
    """The HPA's per-direction `tolerance` is refused by API servers older than 1.33 (strict field
    validation): its header said so but not what to do, and the README named no version at all."""
    minor = OLDEST_FOR_GENERATED.rsplit(".", 1)[0]
    header = " ".join(
        line.removeprefix("#").strip() for line in (GENERATED / "hpa.yaml").read_text().splitlines() if line[:1] == "#"
    )
    assert f"on a cluster older than {minor} delete the two `tolerance` lines" in header, header
    readme = " ".join((ROOT / "README.md").read_text().split())
    oldest = OLDEST_KUBERNETES.rsplit(".", 1)[0]
    assert f"The manifests need Kubernetes {oldest} or later; the generated HPA {minor} or later" in readme
    assert "on an older cluster delete its two `tolerance:` lines or apply the KEDA ScaledObject" in readme


# -- the image ---------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_image_runs_as_the_user_the_pods_require():
    final_stage = dockerfile_instructions()
    final_stage = final_stage[max(i for i, (w, _) in enumerate(final_stage) if w == "FROM") :]
    (user,) = [rest for w, rest in final_stage if w == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot needs a numeric, non-root USER"
    for path, doc in load_all():
        if (pod := pod_spec(doc)) is not None:
            assert pod["securityContext"]["runAsUser"] == int(uid), path.name
            assert pod["securityContext"]["runAsGroup"] == int(gid or uid), path.name
    env = " ".join(rest for w, rest in final_stage if w == "ENV")
    assert "HOME=/tmp" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    assert ("ENTRYPOINT", '["wok"]') in final_stage
    (cmd,) = [rest for w, rest in final_stage if w == "CMD"]
    assert parse_serve(json.loads(cmd)).host == "0.0.0.0"


def test_the_image_copies_every_package_and_the_context_keeps_them():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = set()
    for word, rest in dockerfile_instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            copied |= set(sources)
    assert package_dirs | {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    kept = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    assert copied <= kept, f"the context leaves out {copied - kept}: COPY would fail"


def test_the_image_installs_the_torch_that_bootstrap_installs():
    args = dict(rest.split("=", 1) for w, rest in dockerfile_instructions() if w == "ARG" and "=" in rest)
    assert args["TORCH_VARIANT"] == "cpu"
    bootstrap = (ROOT / "scripts" / "bootstrap.py").read_text()
    assert f'TORCH_VERSION = "{args["TORCH_VERSION"]}"' in bootstrap


# -- the bench Job -----------------------------------------------------------------------------


def ramp_job() -> tuple[dict, dict]:
    job = one("Job", "wok-bench-ramp")
    return job, container(job["spec"]["template"]["spec"], "bench")


def pod_env(c: dict, index: int) -> dict[str, str]:
    """The container's env as the kubelet sees it in pod `index` of an Indexed Job."""
    env = {}
    for name, e in env_of(c).items():
        if "value" in e:
            env[name] = e["value"]
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']", path
            env[name] = str(index)
    return env


def test_the_ramp_job_is_indexed_and_all_parts_run_at_once():
    job, _ = ramp_job()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] >= 2
    assert spec["backoffLimit"] == 0, "a retried part would offer its share at another time"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_the_parts_offer_the_intended_total_per_step():
    from wok.bench.arrivals import parse_duration, parse_steps

    job, c = ramp_job()
    n = job["spec"]["completions"]
    total = [Fraction(str(q)) for q in parse_steps(job["metadata"]["annotations"]["wok/total-steps"])]
    seeds, outputs = set(), set()
    for i in range(n):
        args = parse_bench([expand(a, pod_env(c, i)) for a in c["args"]])
        per_pod = [Fraction(str(q)) for q in parse_steps(args.steps)]
        assert [q * n for q in per_pod] == total, f"pod {i}: {args.steps} × {n} != {total}"
        seeds.add(args.seed)
        outputs.add(str(args.json))
        # Every pod runs every step for the same time, and nothing adaptive that would make
        # one pod's steps differ from another's.
        assert args.stop_factor >= 1e6 and args.refine == 0 and args.require_qps is None
        assert args.metrics_url == "none"
        assert args.arrival == "poisson", "independent Poisson streams add up to one; constant ones would align"
        period = parse_duration(args.step_duration) + parse_duration(args.warmup) + parse_duration(args.step_gap)
        assert job["spec"]["activeDeadlineSeconds"] >= len(per_pod) * period + 300
    assert len(seeds) == n, "identical seeds would send the same arrival times from every pod"
    assert outputs == {f"/results/part-{i}.json" for i in range(n)}


def test_the_ramp_targets_the_headless_service_and_writes_to_the_shared_volume():
    job, c = ramp_job()
    args = parse_bench([expand(a, pod_env(c, 0)) for a in c["args"]])
    headless = one("Service", "wok-headless")
    meta, (port,) = headless["metadata"], headless["spec"]["ports"]
    assert args.target == f"dns:///{meta['name']}.{meta['namespace']}.svc.cluster.local:{port['port']}"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert str(args.json.parent) in mounts
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[mounts[str(args.json.parent)]]["persistentVolumeClaim"]["claimName"]
    pvc = one("PersistentVolumeClaim", claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], "the bench pods run on several nodes"
    merge = one("Job", "wok-bench-merge")
    mc = container(merge["spec"]["template"]["spec"], "merge")
    merge_volumes = {v["name"]: v for v in merge["spec"]["template"]["spec"]["volumes"]}
    merge_mounts = {m["mountPath"]: m["name"] for m in mc["volumeMounts"]}
    assert merge_volumes[merge_mounts[str(args.json.parent)]]["persistentVolumeClaim"]["claimName"] == claim


def test_the_merge_job_names_exactly_the_parts_the_ramp_writes(tmp_path):
    job, c = ramp_job()
    n = job["spec"]["completions"]
    merge = container(one("Job", "wok-bench-merge")["spec"]["template"]["spec"], "merge")
    assert merge["command"] == ["/bin/sh", "-c"]
    (script,) = merge["args"]
    assert int(env_of(merge)["PARTS"]["value"]) == n
    assert script.count("exec wok bench merge $parts ") == 1
    # Run the script's own loop with a shell, printing the argument list it would exec.
    shown = script.replace("exec wok bench merge $parts ", 'printf "%s\\n" $parts; : ')
    out = subprocess.run(
        ["/bin/sh", "-c", shown], env={"PARTS": str(n), "PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    written = [str(parse_bench([expand(a, pod_env(c, i)) for a in c["args"]]).json) for i in range(n)]
    assert out.stdout.split() == written


@pytest.fixture(scope="module", autouse=True)
def _deployment_server_starting(start_server_module, tmp_path_factory):
    """Starts `wok serve` with the Deployment's own arguments, on loopback and free ports,
    serving the ConfigMap's repository, as the module begins: its start (a process's imports
    and a model load) runs while the tests that read the files do."""
    from concurrent.futures import ThreadPoolExecutor

    _, c, _ = server_parts()
    repo = materialize_repository(tmp_path_factory.mktemp("deployment") / "models")
    local = {"--host": "127.0.0.1", "--port": "0", "--metrics-host": "127.0.0.1", "--metrics-port": "0"}
    local["--model-repository"] = str(repo)
    argv = []
    for a in c["args"][1:]:
        flag, eq, _ = a.partition("=")
        argv.append(f"{flag}={local[flag]}" if eq and flag in local else a)
    with ThreadPoolExecutor(1) as ex:
        yield ex.submit(start_server_module, *argv)


@pytest.fixture(scope="module")
def deployment_server(_deployment_server_starting):
    """The Deployment's server: the one the bench Job runs against, and the one the last test
    stops as the kubelet would."""
    return _deployment_server_starting.result()


def test_two_parts_of_the_ramp_job_and_the_merge_job_script_run_on_loopback(deployment_server, tmp_path):
    """The Job's own arguments, smaller: two parts against a real server, then the merge script.

    Only what cannot run here changes: the target (the Deployment's server on loopback), the
    results folder, the rates (÷ 100), the durations and the worker count. The seeds, the file
    names, the shell loop and `wok bench merge` are the manifests' own.
    """
    from wok.bench.arrivals import parse_steps

    _, c = ramp_job()
    sp = deployment_server
    results = tmp_path / "results"
    results.mkdir()
    parts = 2
    local = {
        "--target": sp.target,
        # At the first step's 2 QPS a part sends about one request (seeded): a step with none
        # would end its ramp ("the step sent no request"), so the steps stay this long.
        "--step-duration": "0.5s",
        "--warmup": "0.1s",
        # More than the bench's own 0.2 s lead before each step: the last answers of a step and
        # its summary fit in the rest, so no part starts a step late.
        "--step-gap": "0.3s",
        "--workers": "1",
        # Time for both processes to import, build their pools and start their workers (4-6 s
        # on a slow hour of a 2-core host, both at once; 1.8 s on a slow day with the suite
        # running alone).
        "--start-at": f"{time.time() + 7:.3f}",
    }
    procs, per_pod = [], None
    for i in range(parts):
        argv = []
        for a in c["args"]:
            a = expand(a, pod_env(c, i)).replace("/results/", f"{results}/")
            flag, eq, value = a.partition("=")
            if flag == "--steps":
                per_pod = [q / 100 for q in parse_steps(value)]
                a = "--steps=" + ",".join(f"{q:g}" for q in per_pod)
            elif eq and flag in local:
                a = f"{flag}={local[flag]}"
            argv.append(a)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "wok", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
        print(*[line for line in out.splitlines() if "waiting" in line or "late" in line], sep="\n")
    merge = container(one("Job", "wok-bench-merge")["spec"]["template"]["spec"], "merge")
    (script,) = merge["args"]
    script = script.replace("/results/", f"{results}/").replace("exec wok ", f"exec {sys.executable} -m wok ")
    done = subprocess.run(
        ["/bin/sh", "-c", script], env={**os.environ, "PARTS": str(parts)}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    merged = json.loads((results / "merged.json").read_text())
    assert (results / "merged.html").is_file()
    assert merged["config"]["merged"]["seeds"] == list(range(parts))
    assert merged["config"]["steps"] == pytest.approx([parts * q for q in per_pod])
    part_results = [json.loads((results / f"part-{i}.json").read_text()) for i in range(parts)]
    for k, step in enumerate(merged["steps"]):
        assert step["requests"] == sum(r["steps"][k]["requests"] for r in part_results)
    # Both parts ran every step in its slot, so the merged steps are one load, not two offsets.
    assert [s["start_late_s"] for r in part_results for s in r["steps"]] == [0.0] * parts * len(per_pod)


def test_every_part_runs_each_step_in_one_wall_clock_slot():
    """The parts start each step at START_AT + k × period (`--start-at`), with no init
    container: the bench itself waits, after building its pool and workers, so their start-up
    does not stagger the parts either, and it fails a part that is later than the warm-up."""
    from wok.bench.cli import _unix_time

    job, c = ramp_job()
    assert "initContainers" not in job["spec"]["template"]["spec"]
    assert env_of(c)["START_AT"]["value"] == "START_AT_EPOCH"
    periods = set()
    for i in range(job["spec"]["completions"]):
        args = parse_bench([expand(a, pod_env(c, i)) for a in c["args"]])
        assert args.start_at == "START_AT_EPOCH", "every pod reads the one START_AT"
        periods.add((args.step_duration, args.warmup, args.step_gap))
    assert len(periods) == 1
    # Applied as the docs say (sed puts in a number), the value parses; left alone, it is refused.
    assert _unix_time("1900000000") == 1.9e9
    with pytest.raises(ValueError, match="--start-at: expected a Unix time in seconds"):
        _unix_time("START_AT_EPOCH")


# -- the model repository, served --------------------------------------------------------------


def test_the_configmap_repository_loads_with_the_mlp_demo_weights(tmp_path):
    import torch

    from wok.models import build_demo
    from wok.repository import ModelRepository

    repo = ModelRepository.from_directory(materialize_repository(tmp_path / "models"))
    assert sorted(repo.models) == repository_models() == ["mlp"]
    served, demo = repo.models["mlp"], build_demo("mlp")
    assert served.config.max_batch_size == demo.config.max_batch_size
    assert [(t.name, t.datatype, t.dims) for t in served.config.inputs] == [
        (t.name, t.datatype, t.dims) for t in demo.config.inputs
    ]
    cpu = torch.device("cpu")
    mine, theirs = served.module_for(cpu).state_dict(), demo.module_for(cpu).state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        assert (mine[k] == theirs[k]).all(), f"{k}: replicas (and the demo) would answer differently"


def test_wok_serve_starts_with_the_deployment_args_and_exits_within_the_grace_period(deployment_server):
    from wok.clients import Client

    deployment, c, _ = server_parts()
    sp = deployment_server
    assert sp.models == ["mlp"]
    with grpc.insecure_channel(sp.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            req = health_pb2.HealthCheckRequest(service=c[kind]["grpc"].get("service", ""))
            assert health.Check(req, timeout=10).status == SERVING, kind
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    with Client(sp.target) as client:
        assert client.infer("mlp", {"INPUT0": x})["OUTPUT0"].shape == (3, 256)
    t0 = time.monotonic()
    sp.proc.send_signal(signal.SIGTERM)
    tgps = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sp.proc.wait(timeout=tgps - pre_stop) == 0, "\n".join(sp.log[-20:])
    print(f"idle wok serve exited {time.monotonic() - t0:.2f} s after SIGTERM")


async def test_readiness_turns_not_serving_while_the_server_drains(serve, slow_repository, tmp_path):
    from wok.codec import encode_request
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    _, c, _ = server_parts()
    service = c["readinessProbe"]["grpc"].get("service", "")
    repo = slow_repository(sleep_ms=300, max_batch_size=1, delay_ms=0)
    materialize_repository(repo)
    async with serve(repository=repo) as server:
        assert set(server.runtimes) == {"slow", "mlp"}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == SERVING
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            held = asyncio.ensure_future(
                stub.ModelInfer(encode_request("slow", {"INPUT0": np.ones((1, 4), np.float32)}))
            )
            while server.runtimes["slow"].batcher.inflight == 0:
                await asyncio.sleep(0.001)
            stopping = asyncio.ensure_future(server.stop(grace=10))
            while not server.draining:
                await asyncio.sleep(0)
            # The held request keeps the drain going: the probe sees NOT_SERVING, not a
            # closed port.
            assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == NOT_SERVING
            await held
            await stopping
