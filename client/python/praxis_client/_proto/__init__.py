"""The generated modules of proto/praxis/v1/praxis.proto: praxis_pb2 and praxis_pb2_grpc.

A wheel carries them in this folder (setup.py generates them at build time), importing each other
relatively, so that no top-level ``praxis`` package exists. Where they are absent (the source
tree), and whenever ``$PRAXIS_PROTO_DIR`` is set, they are generated at first import into a cache
folder put first on this package's ``__path__``; see praxis_client._stubs.
"""
import os

from praxis_client import _stubs

if os.environ.get("PRAXIS_PROTO_DIR") or not os.path.isfile(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), _stubs.MODULES[0])):
    __path__.insert(0, _stubs.cached())
