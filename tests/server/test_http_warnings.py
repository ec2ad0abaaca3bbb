"""The start-up warning for a metrics port bound beyond loopback (server/auth.py), with and without --admin."""

from __future__ import annotations

from wok.auth import security_warnings
from wok.config import server_settings


def test_an_exposed_metrics_port_with_admin_warns_that_anyone_can_inject_faults():
    [plain] = security_warnings(server_settings(metrics_host="0.0.0.0"))
    assert plain == (
        "/metrics listens on 0.0.0.0: plain HTTP without authentication; anyone who reaches it reads the "
        "model names and traffic figures"
    )
    [admin] = security_warnings(server_settings(metrics_host="0.0.0.0", admin=True))
    assert admin == (
        "/metrics listens on 0.0.0.0: plain HTTP without authentication; anyone who reaches it reads the "
        "model names and traffic figures, and, with --admin, can inject faults (fail or slow down every "
        "request of a model) and change its batching"
    )
    assert security_warnings(server_settings(metrics_host="127.0.0.1", admin=True)) == []
