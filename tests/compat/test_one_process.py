"""wok and Triton's own client, `tritonclient[grpc]`, in one process.

Both define the KServe V2 `inference.*` protobuf messages; wok's stubs keep theirs in a
descriptor pool of their own (wok.v2pb._pool), so importing both must not fail with
"duplicate symbol", in either order, and each side's messages must still read the other's
bytes. test_tritonclient.py drives a server from a separate process; these tests call one
from this process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

WOK_IMPORTS = "import wok.clients, wok.codec\nfrom wok.v2pb import grpc_service_pb2 as wok_pb, grpc_service_pb2_grpc"
TRITON_IMPORTS = "import tritonclient.grpc\nfrom tritonclient.grpc import service_pb2 as triton_pb"
# Each side parses what the other serialized: the wire is all the two share.
ROUND_TRIP = textwrap.dedent(
    """
    sent = wok_pb.ModelInferRequest(model_name="mlp", inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2]}])
    got = triton_pb.ModelInferRequest.FromString(sent.SerializeToString())
    assert (got.model_name, got.inputs[0].name, list(got.inputs[0].shape)) == ("mlp", "INPUT0", [1, 2]), got
    back = wok_pb.ModelInferResponse.FromString(triton_pb.ModelInferResponse(model_name="mlp").SerializeToString())
    assert back.model_name == "mlp", back
    """
)


@pytest.mark.parametrize("first", ["wok", "tritonclient"])
def test_wok_and_tritonclient_import_in_either_order(first):
    # A fresh interpreter: this one has imported wok already, so cannot try tritonclient first.
    imports = [WOK_IMPORTS, TRITON_IMPORTS] if first == "wok" else [TRITON_IMPORTS, WOK_IMPORTS]
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join([*imports, ROUND_TRIP])],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"importing {first} first failed:\n{proc.stderr}"


async def test_tritonclient_calls_a_wok_server_in_the_same_process(serve):
    import tritonclient.grpc as grpcclient

    from wok.clients import AsyncClient

    x = np.random.default_rng(7).standard_normal((2, 256), dtype=np.float32)
    async with serve(models=("mlp",)) as server:
        target = f"127.0.0.1:{server.port}"
        async with AsyncClient(target) as wok_client:
            expected = (await wok_client.infer("mlp", {"INPUT0": x}))["OUTPUT0"]

        def call_with_tritonclient() -> np.ndarray:
            # Blocking, so off the event loop that serves it.
            with grpcclient.InferenceServerClient(target) as client:
                assert client.is_model_ready("mlp")
                inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                return client.infer("mlp", [inp], client_timeout=30).as_numpy("OUTPUT0")

        got = await asyncio.to_thread(call_with_tritonclient)
    np.testing.assert_array_equal(got, expected)


async def test_reflection_describes_wok_services_beside_tritonclients_types(serve):
    # tritonclient's copy of inference.* is in the default pool: reflection must answer from wok's.
    import tritonclient.grpc  # noqa: F401

    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)

            async def ask():
                for symbol in ("inference.GRPCInferenceService", "grpc.health.v1.Health"):
                    yield reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)

            answers = [resp async for resp in stub.ServerReflectionInfo(ask())]
    files = {}
    for resp in answers:
        assert not resp.HasField("error_response"), resp.error_response
        for raw in resp.file_descriptor_response.file_descriptor_proto:
            f = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[f.name] = f
    assert {"wok/v2pb/grpc_service.proto", "wok/v2pb/model_config.proto", "grpc_health/v1/health.proto"} <= set(files)
    (service,) = files["wok/v2pb/grpc_service.proto"].service
    assert service.name == "GRPCInferenceService"
    assert "ModelInfer" in {m.name for m in service.method}
