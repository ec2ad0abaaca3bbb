"""wok.reflection's stream ending at the stop, where a real call cannot time what it needs: the call
cancelled in the moment the stop's end waits for the stream's pending read to end."""

from __future__ import annotations

import asyncio

import pytest
from grpc_reflection.v1alpha import reflection

from wok.reflection import ReflectionServicer, _Requests


class _HeldRead:
    """A client's requests, none sent: its read, once cancelled, ends only at `let_go` (gRPC's ends one loop
    iteration later)."""

    def __init__(self) -> None:
        self.reading, self.cancelled, self.let_go = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def __aiter__(self):
        return self

    async def __anext__(self):
        self.reading.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.let_go.wait()
            raise


async def test_a_stream_cancelled_as_the_stop_ends_its_read_ends_cancelled():
    """The stop's end cancels the stream's pending read and waits for it: a cancellation of the call itself
    meanwhile (its client gone, gRPC's stop past its grace) was taken for the read's and dropped, and the
    handler went on to answer UNAVAILABLE on a call already ended."""
    servicer = ReflectionServicer([reflection.SERVICE_NAME])
    source = _HeldRead()
    requests = _Requests(source, servicer)

    async def consume() -> None:
        async for _ in requests:
            pass

    stream = asyncio.ensure_future(consume())
    await source.reading.wait()
    servicer.end_streams()
    await source.cancelled.wait()
    stream.cancel()
    source.let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await stream
    assert not requests.cut
