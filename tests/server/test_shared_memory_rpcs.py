"""Triton's shared-memory RPCs, called by Triton's own client (`tritonclient.grpc`), unmodified:
wok answers each itself, not with gRPC's "Method not found!". No region is ever registered, so
the answers are Triton's for that state: a status lists no region (NOT_FOUND for a named one),
an unregister succeeds; a register is UNIMPLEMENTED, naming the region and saying to send the
tensors in the request. The server serves inferences as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest

from wok.app import WokServer
from wok.config import server_settings
from wok.repository import ModelRepository

from .conftest import gated_servable


def stuck_servable(name: str):
    """A 2x model (conftest's GatedDouble, its gate open)."""
    return gated_servable(max_batch_size=1, delay_ms=5.0, depth=None, name=name, enter_when_closed=True)


UNIMPLEMENTED = "StatusCode.UNIMPLEMENTED"
IN_THE_REQUEST = (
    "wok does not support shared memory; send the tensors in the request (raw_input_contents, or the typed contents)"
)


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    """A wok server on loopback with model 'a' (2x), as "host:port"."""
    servable, _ = stuck_servable("a")
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(grace=5)


def call(fn, *args, **kwargs):
    """("OK", what fn returned), or ("ERR", status, message) for what tritonclient raised."""
    from tritonclient.utils import InferenceServerException

    try:
        return "OK", fn(*args, **kwargs)
    except InferenceServerException as exc:
        return "ERR", exc.status(), exc.message()


def infer(client) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer("a", [x]).as_numpy("OUTPUT0")


async def test_tritonclient_system_shared_memory_is_refused_by_name_and_the_server_still_serves():
    import tritonclient.grpc as grpcclient

    async with serving() as target:

        def with_tritonclient() -> dict:
            # Blocking, so off the event loop that serves it.
            with grpcclient.InferenceServerClient(target) as client:
                return {
                    "status": call(client.get_system_shared_memory_status, as_json=True),
                    "status named": call(client.get_system_shared_memory_status, region_name="in0"),
                    "register": call(client.register_system_shared_memory, "in0", "/wok_in0", 64, offset=8),
                    "unregister named": call(client.unregister_system_shared_memory, "in0"),
                    "unregister all": call(client.unregister_system_shared_memory),
                    "status after": call(client.get_system_shared_memory_status, as_json=True),
                    "infer": infer(client),
                }

        got = await asyncio.to_thread(with_tritonclient)
    assert got["status"] == ("OK", {})  # as_json of a status with no region
    assert got["status named"] == ("ERR", "StatusCode.NOT_FOUND", "Unable to find system shared memory region: 'in0'")
    assert got["register"] == (
        "ERR",
        UNIMPLEMENTED,
        f"cannot register system shared memory region 'in0': {IN_THE_REQUEST}",
    )
    assert got["unregister named"] == ("OK", None)
    assert got["unregister all"] == ("OK", None)
    assert got["status after"] == ("OK", {})
    np.testing.assert_array_equal(got["infer"], np.full((1, 4), 2.0, np.float32))


async def test_tritonclient_cuda_shared_memory_is_refused_by_name_and_the_server_still_serves():
    import tritonclient.grpc as grpcclient

    async with serving() as target:

        def with_tritonclient() -> dict:
            with grpcclient.InferenceServerClient(target) as client:
                status = call(client.get_cuda_shared_memory_status)
                return {
                    "status": (status[0], len(status[1].regions)) if status[0] == "OK" else status,
                    "status named": call(client.get_cuda_shared_memory_status, region_name="out0"),
                    # The raw handle is what cudaIpcGetMemHandle gives: 64 bytes; never opened by wok.
                    "register": call(client.register_cuda_shared_memory, "out0", bytes(64), 0, 64),
                    "unregister named": call(client.unregister_cuda_shared_memory, "out0"),
                    "unregister all": call(client.unregister_cuda_shared_memory),
                    "infer": infer(client),
                }

        got = await asyncio.to_thread(with_tritonclient)
    assert got["status"] == ("OK", 0)
    assert got["status named"] == ("ERR", "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'out0'")
    assert got["register"] == (
        "ERR",
        UNIMPLEMENTED,
        f"cannot register CUDA shared memory region 'out0': {IN_THE_REQUEST}",
    )
    assert got["unregister named"] == ("OK", None)
    assert got["unregister all"] == ("OK", None)
    np.testing.assert_array_equal(got["infer"], np.full((1, 4), 2.0, np.float32))


@pytest.mark.parametrize(
    ("method", "kind"), [("SystemSharedMemoryRegister", "system"), ("CudaSharedMemoryRegister", "CUDA")]
)
async def test_register_is_unimplemented_with_why_on_the_wire(method, kind):
    """code() and details() as any gRPC client sees them, not only through tritonclient."""
    from tritonclient.grpc import service_pb2 as triton_pb
    from tritonclient.grpc import service_pb2_grpc as triton_grpc

    async with serving() as target, grpc.aio.insecure_channel(target) as channel:
        request = getattr(triton_pb, f"{method}Request")(name="r", byte_size=16)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(triton_grpc.GRPCInferenceServiceStub(channel), method)(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == f"cannot register {kind} shared memory region 'r': {IN_THE_REQUEST}"


def test_the_messages_are_tritons_field_for_field():
    """Same names, numbers and types as tritonclient's stubs, so the bytes mean the same on both ends."""
    from tritonclient.grpc import service_pb2 as triton_pb

    from wok.v2pb import grpc_service_pb2 as pb

    def fields(desc) -> list:
        out = []
        for f in desc.fields:
            sub = fields(f.message_type) if f.message_type is not None else None
            out.append((f.name, f.number, f.type, f.is_repeated, sub))
        return out

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for kind in ("System", "Cuda"):
        for what in ("Status", "Register", "Unregister"):
            name = f"{kind}SharedMemory{what}"
            ours, their = service.methods_by_name[name], theirs.methods_by_name[name]
            assert ours.input_type.full_name == their.input_type.full_name == f"inference.{name}Request"
            assert ours.output_type.full_name == their.output_type.full_name == f"inference.{name}Response"
            assert not ours.client_streaming and not ours.server_streaming
            for end in ("Request", "Response"):
                mine, tritons = getattr(pb, name + end).DESCRIPTOR, getattr(triton_pb, name + end).DESCRIPTOR
                assert fields(mine) == fields(tritons), name + end
