"""The errors of praxis_client: every failure a caller can handle is a PraxisError."""
import grpc

_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}


class PraxisError(Exception):
    """A failed call: `code` is its grpc.StatusCode and `message` the server's text.

    INVALID_ARGUMENT messages start with the offending field ("text: ...", "frames_per_chunk: ...").
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class RpcFailed(PraxisError):
    """The gRPC call ended with a non-OK status (from the server, or the transport's)."""


class StepFailed(PraxisError):
    """The server answered a step with a StepError (a failed Session step; the session goes on)."""


class ProtocolError(PraxisError):
    """The response stream broke the protocol (order, offsets or sizes); code DATA_LOSS."""

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.DATA_LOSS, message)


def status_code(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a numeric status (a StepError's code); UNKNOWN if there is none."""
    return _STATUS_CODES.get(value, grpc.StatusCode.UNKNOWN)


def rpc_failed(e: grpc.RpcError) -> RpcFailed:
    """The RpcFailed of a grpc.RpcError: its code and details."""
    return RpcFailed(e.code(), e.details() or "")
