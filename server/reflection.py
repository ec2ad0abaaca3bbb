"""gRPC reflection for wok: grpc_reflection's servicer, whose open streams end at the stop.

A reflection stream lasts as long as its client keeps it open (grpcurl its whole command, grpcui
and Postman while their window is), and grpc_reflection's ends only when the client closes its
side: each open one held the server's stop for gRPC's whole stop grace, then got UNAVAILABLE
"Cancelling all calls". Here they end as the health Watch streams do (`HealthServicer.end_watches`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

import grpc
from grpc_reflection.v1alpha import reflection

from .health import ENDED


class ReflectionServicer(reflection.aio.ReflectionServicer):
    """grpc_reflection's, answering the same; `end_streams()` ends the open streams."""

    def __init__(self, service_names, pool=None) -> None:
        super().__init__(service_names, pool=pool)
        self._ended = asyncio.Event()
        self.open_streams = 0
        self.requests_read = 0  # all streams together: each of these gets its answer

    def end_streams(self) -> None:
        """Each open stream answers the request it has read and ends with UNAVAILABLE, as do those
        opened after this; one that had read its client's end (the client closed its side) ends OK."""
        self._ended.set()

    async def ServerReflectionInfo(self, request_iterator: AsyncIterable, context) -> AsyncIterator:
        requests = _Requests(request_iterator, self)
        self.open_streams += 1
        try:
            async for answer in super().ServerReflectionInfo(requests, context):
                yield answer
        finally:
            self.open_streams -= 1
        if requests.cut:
            await context.abort(grpc.StatusCode.UNAVAILABLE, ENDED)


class _Requests:
    """A stream's requests up to its client's end or the servicer's `end_streams()`, whichever is
    first: a request read by then is handed on (and answered), one not read yet is left unread, and
    `cut` says the stop ended it."""

    def __init__(self, requests: AsyncIterable, servicer: ReflectionServicer) -> None:
        self._requests, self._servicer, self._ended = requests, servicer, servicer._ended
        self.cut = False

    async def __aiter__(self) -> AsyncIterator:
        source = aiter(self._requests)
        end = asyncio.ensure_future(self._ended.wait())
        read = None
        try:
            while not self._ended.is_set():
                read = asyncio.ensure_future(anext(source))
                await asyncio.wait((read, end), return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    # Cancelled, or the call's own end meanwhile: either way no request to answer. Not `await
                    # read` with its CancelledError suppressed: a cancellation of this task meanwhile (the call
                    # ended) was taken for the read's and dropped.
                    await asyncio.wait((read,))
                    break
                try:
                    request = read.result()
                except StopAsyncIteration:
                    return
                self._servicer.requests_read += 1
                yield request
            self.cut = True
        finally:
            end.cancel()
            if read is not None:
                read.cancel()  # the call cancelled by its client, or gRPC's stop, mid-read
                read.add_done_callback(_outcome_read)  # its error (the call's end) is no one's to raise


def _outcome_read(read: asyncio.Future) -> None:
    """Read a done read's outcome, so that asyncio never logs its error as never retrieved."""
    if not read.cancelled():
        read.exception()
