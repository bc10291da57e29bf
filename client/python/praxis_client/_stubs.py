"""Generates the protobuf and gRPC modules of praxis/v1/praxis.proto for praxis_client._proto.

The stubs are not committed. A wheel built from this directory carries them in
``praxis_client/_proto`` (setup.py calls generate() at build time). Otherwise, and whenever
``$PRAXIS_PROTO_DIR`` is set, cached() generates them with ``grpc_tools.protoc`` at first import
into ``<root>/<hash>``, where root is ``$PRAXIS_PY_STUBS`` or ``~/.cache/praxis-serve/pystubs``,
and praxis_client._proto puts that folder on its ``__path__``.

protoc writes ``praxis/v1/praxis_pb2.py`` and a ``praxis_pb2_grpc.py`` that imports it as
``from praxis.v1 import praxis_pb2``: a top-level ``praxis`` package, which would clash with any
other ``praxis`` in the process. generate() writes the two modules flat instead, the gRPC one
importing its messages relatively, and the message classes named after ``praxis_client._proto``.

The proto directory (the one holding ``praxis/v1/praxis.proto``) is ``$PRAXIS_PROTO_DIR``, else
``proto/`` of the source tree this package sits in.

Only stdlib modules are imported at the top: setup.py loads this file before grpcio is importable.
"""
import hashlib
import os
import re
import shutil
import tempfile

PROTO = os.path.join("praxis", "v1", "praxis.proto")
PACKAGE = "praxis_client._proto"
MODULES = ("praxis_pb2.py", "praxis_pb2_grpc.py")
_FORMAT = b"flat-relative-1"  # bumped when generate()'s output changes: part of the cache key
_SOURCE_PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                 "proto")
# What protoc writes that names the top-level package, and what it becomes.
_REWRITES = (
    (re.compile(r"^from praxis\.v1 import (\w+_pb2) as ", re.M), r"from . import \1 as "),
    (re.compile(r"'praxis\.v1\.(\w+_pb2)'"), rf"'{PACKAGE}.\1'"),
)
_TOP_LEVEL_IMPORT = re.compile(r"^\s*(from|import)\s+praxis\b", re.M)


def proto_dir():
    """The directory holding praxis/v1/praxis.proto: $PRAXIS_PROTO_DIR, else the source tree's."""
    d = os.path.abspath(os.environ.get("PRAXIS_PROTO_DIR") or _SOURCE_PROTO_DIR)
    if not os.path.isfile(os.path.join(d, PROTO)):
        raise ImportError(
            f"praxis_client: {os.path.join(d, PROTO)} not found; set PRAXIS_PROTO_DIR to the "
            "directory holding praxis/v1/praxis.proto (the repository's proto/)")
    return d


def _protoc(protos, out):
    """Runs grpc_tools.protoc on `protos`/PROTO, writing praxis/v1/*.py under `out`."""
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError("praxis_client: generating the stubs needs grpcio-tools "
                          "(pip install grpcio-tools)") from e
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")  # google/protobuf/*
    rc = protoc.main(["grpc_tools.protoc", f"-I{protos}", f"-I{well_known}",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(protos, PROTO)])
    if rc != 0:
        raise ImportError(f"praxis_client: protoc failed on {os.path.join(protos, PROTO)} ({rc})")


def generate(protos, out):
    """Writes MODULES for `protos`/PROTO into the folder `out`, importing each other relatively.

    Needs grpcio-tools. ImportError if protoc fails or its output still imports a top-level
    `praxis` after the rewrite (a protoc whose output this function does not know).
    """
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="praxis-protoc-") as tmp:
        _protoc(protos, tmp)
        for name in MODULES:
            with open(os.path.join(tmp, "praxis", "v1", name)) as f:
                code = f.read()
            for pattern, replacement in _REWRITES:
                code = pattern.sub(replacement, code)
            if _TOP_LEVEL_IMPORT.search(code):
                raise ImportError(f"praxis_client: {name} still imports a top-level praxis "
                                  f"package: {_TOP_LEVEL_IMPORT.search(code).group(0).strip()}")
            with open(os.path.join(out, name), "w") as f:
                f.write(code)


def generated_versions(out):
    """(protobuf, grpcio): the oldest runtime versions the modules generated in `out` accept, as
    "X.Y.Z" strings, or None where the generated code states none (older generators)."""
    with open(os.path.join(out, MODULES[0])) as f:
        pb = re.search(r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),\s*(\d+),",
                       f.read())
    with open(os.path.join(out, MODULES[1])) as f:
        grpc = re.search(r"^GRPC_GENERATED_VERSION = '([\d.]+)'", f.read(), re.M)
    return (".".join(pb.groups()) if pb else None, grpc.group(1) if grpc else None)


def _generator_version():
    """The installed grpcio-tools' version ("" if none): stubs of another generator differ."""
    from importlib import metadata
    try:
        return metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        return ""


def cached():
    """The cache folder of MODULES for the current proto file and generator, generated there
    first if missing (atomically: concurrent first imports are safe)."""
    protos = proto_dir()
    with open(os.path.join(protos, PROTO), "rb") as f:
        key = f.read() + _FORMAT + _generator_version().encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    root = os.environ.get("PRAXIS_PY_STUBS") or os.path.join(
        os.path.expanduser("~"), ".cache", "praxis-serve", "pystubs")
    final = os.path.join(root, digest)
    if all(os.path.isfile(os.path.join(final, m)) for m in MODULES):
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
