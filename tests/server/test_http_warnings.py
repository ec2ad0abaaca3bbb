"""The start-up warning for a metrics port bound beyond loopback (server/auth.py), with and without --admin,
and with metrics off (what the port then serves, if it opens at all)."""

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


ADMIN_WITHOUT_METRICS = (
    "the admin API (/admin/*, /events) listens on 0.0.0.0: plain HTTP without authentication; anyone who "
    "reaches it can inject faults (fail or slow down every request of a model), change its batching, and read "
    "the model names and live batch and traffic figures from /events (/metrics is off: --no-metrics)"
)


def test_with_metrics_off_the_warning_names_what_the_port_serves_for_the_cli_and_a_library_caller():
    # A library caller's settings keep the metrics port with metrics off: the port opens, answering
    # only 404s (tests/integration/test_no_metrics.py), so there is nothing to warn about.
    assert security_warnings(server_settings(metrics=False, metrics_host="0.0.0.0")) == []
    # `wok serve --no-metrics` (without --admin) opens no port: its settings have no metrics_port.
    assert security_warnings(server_settings(metrics=False, metrics_host="0.0.0.0", metrics_port=None)) == []
    # With --admin (the CLI keeps the port for it, as a library caller's settings do), the admin API
    # and /events are exposed, and /metrics is not.
    for port in (8002, 0):
        settings = server_settings(metrics=False, admin=True, metrics_host="0.0.0.0", metrics_port=port)
        assert security_warnings(settings) == [ADMIN_WITHOUT_METRICS]
    assert security_warnings(server_settings(metrics=False, admin=True, metrics_host="::1")) == []
