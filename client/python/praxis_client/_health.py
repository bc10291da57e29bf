"""grpc.health.v1.Health/Check without generated stubs.

Generating grpc/health/v1/health.proto here would register it in the process's default descriptor
pool, where it clashes with grpcio-health-checking's copy of the same file name whenever the two
differ (upstream's has grown a List method). The two messages are one field each; they are
encoded by hand.
"""
from praxis_client.errors import ProtocolError

METHOD = "/grpc.health.v1.Health/Check"
STATUSES = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int):
    n = shift = 0
    while True:
        if i >= len(data):
            raise ProtocolError("a truncated HealthCheckResponse")
        b = data[i]
        n |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return n, i


def encode_request(service: str) -> bytes:
    """A grpc.health.v1.HealthCheckRequest: field 1, the service name."""
    name = service.encode("utf-8")
    return b"\x0a" + _varint(len(name)) + name if name else b""


def decode_status(data: bytes) -> int:
    """Field 1 (status) of a grpc.health.v1.HealthCheckResponse; other fields are skipped."""
    status, i = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            size, i = _read_varint(data, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ProtocolError(f"HealthCheckResponse: wire type {wire} of field {field}")
    return status


def status_name(status: int) -> str:
    """The ServingStatus name of `status` ("UNKNOWN" for a value this client does not know)."""
    return STATUSES[status] if 0 <= status < len(STATUSES) else "UNKNOWN"
