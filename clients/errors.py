"""The one exception the clients raise for a call that failed on the wire or on the server."""

from __future__ import annotations

import grpc


class InferError(Exception):
    """A call ended with a non-OK gRPC status.

    `code` is the `grpc.StatusCode`, `details` the server's message (it names the input,
    what was expected and what was got); `str(err)` is "CODE: details".
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    # The default pickling would call __init__ with the formatted message alone; load
    # generators hand errors between processes.
    def __reduce__(self):
        return type(self), (self.code, self.details)

    @classmethod
    def from_rpc_error(cls, exc: grpc.RpcError) -> InferError:
        # grpc.RpcError itself declares neither method; every error grpc raises has both.
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
