"""The gRPC channel of a Client: plaintext, TLS or mTLS, and the bearer token's metadata."""
from typing import Optional

import grpc

_MAX_RECEIVE_BYTES = 64 << 20  # per message; chunks are at most 1 MiB by default


def read_file(path: str, field: str) -> bytes:
    """The bytes of `path`; ValueError naming `field` (the argument that gave it) if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{field}: cannot read {path}: {e.strerror}") from None


def auth_metadata(token: Optional[str], token_file: Optional[str]) -> tuple:
    """The authorization metadata for `token`, or for the first line of `token_file` that is
    neither blank nor a # comment (as the server reads its --auth_token_file); () for none."""
    if token is None and token_file is not None:
        lines = [ln.strip() for ln in read_file(token_file, "token_file").decode().splitlines()]
        token = next((ln for ln in lines if ln and not ln.startswith("#")), None)
        if token is None:
            raise ValueError(f"token_file: no token in {token_file}")
    if not token:
        return ()
    if not token.isprintable() or not token.isascii():
        raise ValueError("token: expected printable ASCII characters only")
    return (("authorization", f"Bearer {token}"),)


def make_channel(address: str, *, tls: bool, tls_ca: Optional[str], tls_cert: Optional[str],
                 tls_key: Optional[str], tls_server_name: Optional[str]) -> grpc.Channel:
    """A channel to `address`: TLS when `tls` or `tls_ca` (roots from `tls_ca`, else gRPC's
    defaults), with the client certificate `tls_cert`/`tls_key` (both or neither) for mTLS;
    plaintext otherwise. ValueError naming the argument for an inconsistent combination."""
    options = [("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
               ("grpc.max_send_message_length", -1)]
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key: expected both or neither")
    secure = tls or tls_ca is not None
    if tls_cert is not None and not secure:
        raise ValueError("tls_cert: a client certificate needs TLS; give tls_ca or tls=True")
    if tls_server_name and not secure:
        raise ValueError("tls_server_name: needs TLS; give tls_ca or tls=True")
    if not secure:
        return grpc.insecure_channel(address, options=options)
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    creds = grpc.ssl_channel_credentials(
        root_certificates=read_file(tls_ca, "tls_ca") if tls_ca else None,
        private_key=read_file(tls_key, "tls_key") if tls_key else None,
        certificate_chain=read_file(tls_cert, "tls_cert") if tls_cert else None)
    return grpc.secure_channel(address, creds, options=options)
