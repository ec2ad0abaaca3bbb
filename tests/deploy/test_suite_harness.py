"""The suite's harness (tests/conftest.py) under pytest-xdist, as `bootstrap.py test` runs it: in a pytest
of its own on two workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_a_report_or_warning_holding_a_lone_surrogate_reaches_the_controller_escaped_under_two_workers(tmp_path):
    # Undecodable bytes of a file name (os.fsdecode) logged by a server, in a failure's message, or in a
    # warning's: execnet refused to carry any of them from a worker, whose crash was an INTERNALERROR
    # ending the run.
    (tmp_path / "test_odd.py").write_text(
        textwrap.dedent(
            """
            import logging
            import warnings

            def test_logs_it():
                logging.getLogger("wok").error("cannot open 'caf\\udce9.bin'")

            def test_fails_naming_it():
                logging.getLogger("wok").error("cannot open 'caf\\udce9.bin'")
                raise ValueError("cannot open 'caf\\udce9.bin'")

            def test_warns_naming_it():
                warnings.warn("cannot open 'caf\\udce9.bin'")
            """
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # `-p conftest`: the suite's conftest as a plugin, here and in each worker; no ini file, so this
    # pytest is the one on the command line.
    args = ["-p", "conftest", "-p", "no:randomly", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", "."]
    args += ["-o", "asyncio_default_fixture_loop_scope=function"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-n", "2", "-rA", "test_odd.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "INTERNALERROR" not in out, out
    assert "1 failed, 2 passed, 1 warning" in out, out
    assert "ValueError: cannot open 'caf\\udce9.bin'" in out, out
    # Each test's captured log, escaped: -rA shows the passed test's too.
    for line in (6, 9):
        assert out.count(f"ERROR    wok:test_odd.py:{line} cannot open 'caf\\udce9.bin'") == 1, out
    # The warning's text, escaped, its category kept (the summary's line; its source line below it is the file's).
    assert out.count("UserWarning: cannot open 'caf\\udce9.bin'") == 1, out
