"""The bare-transport ceiling: grpc.aio on uvloop answering ModelInfer with a prebuilt response.

No model, no batching, no decoding: what Python gRPC alone costs per request on this machine,
the floor under every Python server in the comparison. It uses wok's generated stubs, so it
speaks the same V2 protocol and the same load generator drives it.
Usage: python bare_server.py [GRPC_PORT]
"""

import asyncio
import signal
import sys

import grpc
import numpy as np
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8001
RESPONSE = pb.ModelInferResponse(model_name="mlp", model_version="1")
RESPONSE.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 256])
RESPONSE.raw_output_contents.append(np.zeros((1, 256), np.float32).tobytes())


class Bare(pb_grpc.GRPCInferenceServiceServicer):
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name == "mlp")

    async def ModelMetadata(self, request, context):  # the load generator reads the input shapes
        resp = pb.ModelMetadataResponse(name="mlp", versions=["1"], platform="bare")
        resp.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 256])
        resp.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, 256])
        return resp

    async def ModelInfer(self, request, context):
        return RESPONSE


async def main() -> None:
    # wok's server lifts gRPC core's cap on calls waiting for the application (1,000 by
    # default, beyond which it cancels them); so does this one, so both see the same load.
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.server.max_pending_requests", 1 << 20),
            ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
        ]
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(), server)
    # The load generator's channels ask for health checking, as wok's clients do.
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{PORT}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("BARE_READY", flush=True)
    await stop.wait()
    await server.stop(1.0)


if __name__ == "__main__":
    uvloop.run(main())
