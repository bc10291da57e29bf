"""The generated protobuf and gRPC modules of praxis/v1/praxis.proto.

The stubs are not committed. A wheel built from this directory carries them in
``praxis_client/_generated`` (setup.py generates them at build time). Otherwise, and whenever
``$PRAXIS_PROTO_DIR`` is set, they are generated with ``grpc_tools.protoc`` at first import into
``<root>/<hash of the proto file>``, where root is ``$PRAXIS_PY_STUBS`` or
``~/.cache/praxis-serve/pystubs``.

The proto directory (the one holding ``praxis/v1/praxis.proto``) is ``$PRAXIS_PROTO_DIR``, else
``proto/`` of the source tree this package sits in. The generated modules are imported as
``praxis.v1.praxis_pb2`` and ``praxis.v1.praxis_pb2_grpc``, from a directory put first on sys.path.

Only stdlib modules are imported at the top: setup.py loads this file before grpcio is importable.
"""
import hashlib
import os
import shutil
import sys
import tempfile

PROTO = os.path.join("praxis", "v1", "praxis.proto")
_PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_generated")
_SOURCE_PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                 "proto")


def proto_dir():
    """The directory holding praxis/v1/praxis.proto: $PRAXIS_PROTO_DIR, else the source tree's."""
    d = os.path.abspath(os.environ.get("PRAXIS_PROTO_DIR") or _SOURCE_PROTO_DIR)
    if not os.path.isfile(os.path.join(d, PROTO)):
        raise ImportError(
            f"praxis_client: {os.path.join(d, PROTO)} not found; set PRAXIS_PROTO_DIR to the "
            "directory holding praxis/v1/praxis.proto (the repository's proto/)")
    return d


def generate(protos, out):
    """Writes praxis/v1/praxis_pb2.py and praxis_pb2_grpc.py for `protos`/PROTO under `out`.

    Needs grpcio-tools. Also writes the package __init__.py files, so that these stubs win over
    any other top-level `praxis` package further down sys.path.
    """
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError("praxis_client: generating the stubs needs grpcio-tools "
                          "(pip install grpcio-tools)") from e
    import importlib.resources

    os.makedirs(out, exist_ok=True)
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")  # google/protobuf/*
    rc = protoc.main(["grpc_tools.protoc", f"-I{protos}", f"-I{well_known}",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(protos, PROTO)])
    if rc != 0:
        raise ImportError(f"praxis_client: protoc failed on {os.path.join(protos, PROTO)} ({rc})")
    for package in ("praxis", os.path.join("praxis", "v1")):
        open(os.path.join(out, package, "__init__.py"), "a").close()


def _cached():
    """The cache directory of stubs for the current proto file, generated there if missing."""
    protos = proto_dir()
    with open(os.path.join(protos, PROTO), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    root = os.environ.get("PRAXIS_PY_STUBS") or os.path.join(
        os.path.expanduser("~"), ".cache", "praxis-serve", "pystubs")
    final = os.path.join(root, digest)
    if os.path.isfile(os.path.join(final, "praxis", "v1", "praxis_pb2_grpc.py")):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{digest}-", dir=root)
    try:
        generate(protos, tmp)
        os.rename(tmp, final)  # atomic; fails if another process got there first
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load():
    """Imports and returns (praxis_pb2, praxis_pb2_grpc), generating them first where needed."""
    packaged = os.path.isdir(_PACKAGED) and not os.environ.get("PRAXIS_PROTO_DIR")
    d = _PACKAGED if packaged else _cached()
    if d not in sys.path:
        sys.path.insert(0, d)
    from praxis.v1 import praxis_pb2, praxis_pb2_grpc
    return praxis_pb2, praxis_pb2_grpc
