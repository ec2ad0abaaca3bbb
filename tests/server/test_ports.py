"""bind_cause: what a bind's errno means to an operator, for the errors this host's tests cannot meet for
real (they run as root here, where no port is privileged)."""

from __future__ import annotations

import errno
import socket

import grpc

from wok.ports import bind_cause, bind_error, bind_refusal

from ..conftest import core_servers


def test_a_privileged_port_refused_says_what_would_take_it():
    exc = PermissionError(errno.EACCES, "Permission denied")
    said = bind_refusal("gRPC port", "0.0.0.0", 80, exc)
    assert said.startswith("cannot bind the gRPC port to 0.0.0.0:80: permission denied (EACCES): a port below "), said
    assert said.endswith(" needs root or CAP_NET_BIND_SERVICE"), said
    # Above the privileged range the kernel's reason is another (a security module): no advice that would mislead.
    assert bind_cause(exc, "::", 65000) == "permission denied (EACCES)"


def test_an_errno_without_words_of_its_own_is_named_with_its_symbol():
    assert bind_cause(OSError(errno.ENOBUFS, "x"), "127.0.0.1", 1) == "no buffer space available (ENOBUFS)"


async def test_a_port_in_time_wait_is_refused_only_where_grpc_refuses_it():
    # What a restart on the same port meets after serving connections: a connection the server
    # closed first stays in TIME_WAIT, and a bind refuses its port only if that connection's
    # listener lacked SO_REUSEADDR (gRPC sets it).
    for reuse in (True, False):
        with socket.socket() as server:
            if reuse:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port)):
                conn, _ = server.accept()
                conn.close()
        probed = bind_error("127.0.0.1", port) is None  # first: its socket is closed at once, gRPC's maybe not
        alive = core_servers()
        grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        try:
            grpc_port = grpc_server.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:
            grpc_port = 0
        # Started even with no port, as wok's _release_unstarted does: grpc.aio's stop does nothing to a server never
        # started, whose core server (and port, if bound) then lived until the process ended.
        await grpc_server.start()
        await grpc_server.stop(None)
        assert probed == (grpc_port == port) == reuse, (reuse, grpc_port)
        if grpc_port:
            assert bind_error("127.0.0.1", port) is None, "gRPC's port is still bound after its stop"
        assert core_servers() == alive, f"the gRPC server is still alive after its stop (port {grpc_port or 'refused'})"
