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
close. A failed call raises `InferError` with the gRPC `code` and the server's `details`.

Over TLS, with a bearer token (see docs/security.md):

    tls = TLS.from_files("ca.pem")                     # + certificate_chain=, private_key= for mTLS
    with Client("wok.example:8001", tls=tls, token=os.environ["WOK_TOKEN"]) as client:
        ...
"""

from .aio import AsyncClient
from .channel import TLS
from .errors import InferError
from .messages import ModelInfo, StreamResult, TensorInfo
from .sync import Client

__all__ = ["TLS", "AsyncClient", "Client", "InferError", "ModelInfo", "StreamResult", "TensorInfo"]
