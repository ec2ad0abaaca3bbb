"""grpc.health.v1 for wok: Check, and Watch streams that every watcher keeps and that end at the stop.

Written here rather than taken from grpcio-health-checking's aio servicer, which shares one
condition per service among its watchers and deletes it when any one of them leaves: the others
then miss every later change, the drain's NOT_SERVING included. Its Watch streams also never end,
so each open one held the server's stop for gRPC's whole stop grace.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
ENDED = "server is shutting down"


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Serving status per service name ("" is the server). Build it inside the running loop."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        # One condition for all services: watchers are few, and each re-reads its own status.
        self._changed = asyncio.Condition()
        self._ended = False
        self.watching = 0

    async def set(self, service: str, status: int) -> None:
        async with self._changed:
            self._status[service] = status
            self._changed.notify_all()

    async def end_watches(self) -> None:
        """Each Watch stream writes the status it has not sent yet and ends with UNAVAILABLE, as do
        those opened after this. Set the final statuses first."""
        async with self._changed:
            self._ended = True
            self._changed.notify_all()

    def _read(self, service: str) -> int:
        return self._status.get(service, SERVICE_UNKNOWN)

    async def Check(self, request: health_pb2.HealthCheckRequest, context) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        # Per the protocol, a service not known (yet) is SERVICE_UNKNOWN and is watched on.
        service, sent = request.service, None
        self.watching += 1
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda last=sent: self._ended or self._read(service) != last)
                    status, ended = self._read(service), self._ended
                # Written outside the lock: a watcher that does not read must not hold up set().
                if status != sent:
                    await context.write(health_pb2.HealthCheckResponse(status=status))
                    sent = status
                if ended:
                    break
        finally:
            self.watching -= 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, ENDED)
