"""Triton's sequence parameters from Triton's own client, `tritonclient[grpc]`, on a real wok
server: refused by name with INVALID_ARGUMENT (wok has no sequence batcher, and a sequence
answered statelessly would be taken for the sequence's answers), the server still serving."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np


async def test_tritonclient_sequence_is_refused_by_name_and_the_server_still_serves(serve):
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2_grpc
    from tritonclient.grpc._utils import _get_inference_request
    from tritonclient.utils import InferenceServerException

    x = np.random.default_rng(7).standard_normal((1, 256), dtype=np.float32)
    async with serve(models=("mlp",)) as server:
        target = f"127.0.0.1:{server.port}"

        def with_tritonclient() -> dict:
            # Blocking, so off the event loop that serves it.
            got = {}
            inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            with grpcclient.InferenceServerClient(target) as client:
                try:
                    client.infer("mlp", [inp], sequence_id=7, sequence_start=True, client_timeout=30)
                    got["sequence"] = "answered"
                except InferenceServerException as exc:
                    got["sequence"] = (exc.status(), exc.message())
                got["plain"] = client.infer("mlp", [inp], client_timeout=30).as_numpy("OUTPUT0")
            # The same request as tritonclient builds it, on tritonclient's own stub: the gRPC status.
            request = _get_inference_request(
                model_name="mlp",
                inputs=[inp],
                model_version="",
                request_id="",
                outputs=None,
                sequence_id=7,
                sequence_start=True,
                sequence_end=False,
                priority=0,
                timeout=None,
                parameters=None,
            )
            with grpc.insecure_channel(target) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                try:
                    stub.ModelInfer(request, timeout=30)
                    got["rpc"] = "answered"
                except grpc.RpcError as exc:
                    got["rpc"] = (exc.code(), exc.details())
                got["rpc plain"] = stub.ModelInfer(
                    _get_inference_request("mlp", [inp], "", "", None, 0, False, False, 0, None, None), timeout=30
                )
            return got

        got = await asyncio.to_thread(with_tritonclient)
    message = (
        "parameter 'sequence_id' (int64_param 7) is not supported by this server: it has no sequence batching "
        "(its models are stateless); send the requests without sequence parameters "
        "(sequence_id, sequence_start, sequence_end)"
    )
    assert got["sequence"] == ("StatusCode.INVALID_ARGUMENT", message)
    assert got["rpc"] == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert got["plain"].shape[0] == 1 and np.isfinite(got["plain"]).all()
    assert [o.name for o in got["rpc plain"].outputs] == ["OUTPUT0"]
