"""`wok serve --no-metrics`: no HTTP port at all, unless --admin needs one; there /metrics answers 404."""

from __future__ import annotations

import asyncio
import http.client
import json
import os

METRICS_OFF = b"metrics are off: this server runs with --no-metrics\n"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes, found in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def get(conn: http.client.HTTPConnection, path: str, method: str = "GET") -> tuple[int, bytes]:
    conn.request(method, path)
    r = conn.getresponse()
    return r.status, r.read()


def test_no_metrics_opens_no_http_port_and_says_so(start_server):
    sp = start_server("--models", "mlp", "--no-metrics")
    assert "wok: metrics off (--no-metrics): no HTTP port" in sp.log
    assert not any(line.startswith("wok: metrics on") for line in sp.log)
    assert listening_ports(sp.proc.pid) == {sp.port}
    assert sp.terminate() == 0


def test_no_metrics_with_admin_opens_the_port_for_the_admin_api_and_metrics_answers_404(start_server):
    sp = start_server("--models", "mlp", "--no-metrics", "--admin")
    line = sp.wait_for_line("wok: metrics off (--no-metrics); admin API on http://")
    assert line.endswith(" (/metrics answers 404)")
    host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
    assert listening_ports(sp.proc.pid) == {sp.port, int(port)}
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        assert get(conn, "/metrics") == (404, METRICS_OFF)
        status, body = get(conn, "/admin/batching")
        assert status == 200 and [m["model"] for m in json.loads(body)["models"]] == ["mlp"]
    finally:
        conn.close()
    assert sp.terminate() == 0


async def test_the_metrics_port_of_a_server_recording_none_answers_404_and_keeps_the_connection(serve):
    async with serve(models=("mlp",), metrics=False, admin=True) as server:

        def talk() -> list[tuple[int, bytes]]:
            conn = http.client.HTTPConnection("127.0.0.1", server.http.port, timeout=10)
            try:  # one kept-alive connection throughout
                return [get(conn, "/metrics"), get(conn, "/metrics", "HEAD"), get(conn, "/admin/faults")]
            finally:
                conn.close()

        (status, body), head, faults = await asyncio.to_thread(talk)
    assert (status, body) == (404, METRICS_OFF)
    assert head == (404, b"")
    assert faults[0] == 200
