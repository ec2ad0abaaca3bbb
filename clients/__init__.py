"""Python clients for wok (or any KServe V2 gRPC server): numpy arrays in and out.

    from wok.clients import AsyncClient, Client, InferError

    async with AsyncClient("127.0.0.1:8001") as client:
        out = await client.infer("mlp", {"INPUT0": x})          # {"OUTPUT0": array}

    with Client(["127.0.0.1:8001", "127.0.0.1:8002"]) as client:  # round robin over both
        info = client.model_metadata("mlp")                      # ModelInfo
        for r in client.stream_infer([("mlp", {"INPUT0": x})]):  # StreamResult
            ...

`AsyncClient` (asyncio, grpc.aio) and `Client` (blocking, thread-safe) have the same
calls: server_live, server_ready, model_ready, server_metadata, model_metadata,
model_config, model_statistics, repository_index, infer, stream_infer, wait_ready,
close. A failed call raises `InferError` with the gRPC `code` and the server's `details`. A
request over a wok server's published gRPC limit is not sent (`wok.clients.limits`): InferError
RESOURCE_EXHAUSTED, or on a stream that one request's result, and the stream goes on.

Several replicas with wok's balancer (a channel per replica, least loaded of two, hedging,
retries on another replica, outlier ejection; see `wok.clients.balancer` and
docs/reliability.md); the blocking `Client` stays on gRPC's round_robin:

    async with AsyncClient("a:8001,b:8001,c:8001", balancer="wok") as client:
        out = await client.infer("mlp", {"INPUT0": x})
        print(client.balancer.stats())                   # attempts, hedges, ejections per replica

Over TLS, with a bearer token (see docs/security.md):

    tls = TLS.from_files("ca.pem")                     # + certificate_chain=, private_key= for mTLS
    with Client("wok.example:8001", tls=tls, token=os.environ["WOK_TOKEN"]) as client:
        ...
"""

from .aio import AsyncClient
from .balancer import Balancer, BalancerSettings
from .channel import TLS
from .errors import InferError
from .messages import ModelInfo, StreamResult, TensorInfo
from .sync import Client

__all__ = [
    "TLS",
    "AsyncClient",
    "Balancer",
    "BalancerSettings",
    "Client",
    "InferError",
    "ModelInfo",
    "StreamResult",
    "TensorInfo",
]
