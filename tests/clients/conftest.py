"""Loopback gRPC servers whose ModelInfer answers as a test says, for the balancing tests.

A `Stub` is a plain grpc.aio server with the health service and a ModelInfer that fails its
first `fail_first` calls with `code`, or holds every call until `release` is set (a server
that hangs with its connection open), so a test knows exactly how many attempts reached
which server. Its answer names it (the response's model name).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from wok.v2pb import grpc_service_pb2 as pb

CODE = grpc.StatusCode
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Stub:
    """A loopback gRPC server whose ModelInfer fails its first `fail_first` calls with `code`;
    with `hold`, every call waits for `release` (and counts as `cancelled` if the client gives up);
    with `credentials`, it speaks TLS."""

    def __init__(
        self,
        name: str,
        *,
        fail_first: int = 0,
        code: grpc.StatusCode = CODE.UNAVAILABLE,
        hold: bool = False,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.name, self.fail_first, self.code, self.credentials = name, fail_first, code, credentials
        self.calls = 0
        self.cancelled = 0
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self._changed = asyncio.Condition()
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.port = 0

    async def infer(self, request: bytes, context) -> bytes:
        self.calls += 1
        await self._notify()
        if self.calls <= self.fail_first:
            await context.abort(self.code, f"{self.name}: failing call {self.calls}")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            asyncio.get_running_loop().create_task(self._notify())
            raise
        return pb.ModelInferResponse(model_name=self.name).SerializeToString()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate, timeout: float = 10.0) -> None:
        """Return once `predicate()` holds; it is checked at each call's arrival and cancellation."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def wait_calls(self, n: int, timeout: float = 10.0) -> None:
        """Return once `n` calls have reached this server."""
        await self.wait_until(lambda: self.calls >= n, timeout)

    async def __aenter__(self) -> Stub:
        self.server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(self.infer)
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})]
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.credentials is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", self.credentials)
        await self.server.start()
        await self.health.set("", SERVING)
        return self

    async def __aexit__(self, *exc) -> None:
        self.release.set()
        await self.server.stop(0)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def stub():
    """`async with stub("a", fail_first=2) as a:` a Stub server (see the module)."""
    return Stub
