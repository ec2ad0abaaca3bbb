"""What loads torch: a refused `wok serve` option and the metrics port (which `wok demo`'s page
serves on too) do not, so that they cost no second of imports."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def _imported(module: str, importtime: str) -> bool:
    return re.search(rf"^import time: .*\| +{re.escape(module)}$", importtime, re.MULTILINE) is not None


def _importtime(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)


def test_a_refused_serve_option_exits_2_before_torch_is_imported():
    done = _importtime("-m", "wok", "serve", "--models", "mlp", "--grace-period", "-1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "wok: --grace-period: expected >= 0; got -1.0" in done.stderr
    assert _imported("wok.config", done.stderr) and not _imported("torch", done.stderr)
    # Nor the bench's parsers (its clients, numpy, the fault machinery: about 0.3 s of every start).
    assert not _imported("wok.bench.cli", done.stderr) and not _imported("wok.demo.cli", done.stderr)


@pytest.mark.parametrize(
    ("option", "refusal"),
    [
        (("--models", "mlp,nope"), "wok: --models: unknown demo model 'nope'; known: mlp, recsys, encoder"),
        (
            ("--demo-option", "nope.x=1"),
            "wok: --demo-option 'nope.x=1': unknown demo model 'nope'; known: mlp, recsys, encoder",
        ),
        (
            ("--demo-option", "mlp.bogus=1"),
            "wok: --demo-option 'mlp.bogus=1': demo model 'mlp' has no option 'bogus'; its options: in_features, "
            "hidden, out_features, layers, max_batch_size, max_queue_delay_ms, max_queue_size",
        ),
        (
            ("--demo-option", "mlp.hidden=1.5"),
            "wok: --demo-option 'mlp.hidden=1.5': option 'hidden' of demo model 'mlp': expected an integer; got '1.5'",
        ),
        (
            ("--demo-option", "mlp.max_queue_delay_ms=soon"),
            "wok: --demo-option 'mlp.max_queue_delay_ms=soon': option 'max_queue_delay_ms' of demo model 'mlp': "
            "expected a number; got 'soon'",
        ),
    ],
    ids=["--models", "--demo-option model", "--demo-option option", "--demo-option int", "--demo-option float"],
)
def test_an_unknown_demo_model_or_option_exits_2_before_torch_is_imported(option, refusal):
    # Ports that cannot clash: should the name pass, the server would start and the run time out.
    done = _importtime("-m", "wok", "serve", *option, "--port", "0", "--metrics-port", "-1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert refusal in done.stderr.splitlines()
    assert _imported("wok.models", done.stderr) and not _imported("torch", done.stderr)


def test_the_metrics_port_and_its_admin_api_import_no_torch():
    done = _importtime("-c", "import wok.http, wok.admin")
    assert done.returncode == 0, done.stderr[-2000:]
    # The first proves that the check sees a package when it is imported.
    assert _imported("prometheus_client", done.stderr) and not _imported("torch", done.stderr)
