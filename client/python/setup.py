"""Build hook: generates the protobuf/gRPC stubs into the wheel (praxis_client/_generated).

The proto is read from $PRAXIS_PROTO_DIR, else from the repository's proto/ (pip builds this
directory in place, so ../../proto is reachable).
"""
import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py


def _stubs_module():
    """praxis_client/_stubs.py, loaded alone: importing the package would need the stubs."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "praxis_client", "_stubs.py")
    spec = importlib.util.spec_from_file_location("_praxis_client_stubs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithStubs(build_py):
    """build_py that also writes praxis_client/_generated/praxis/v1/praxis_pb2{,_grpc}.py."""

    def run(self):
        super().run()
        stubs = _stubs_module()
        stubs.generate(stubs.proto_dir(), os.path.join(self.build_lib, "praxis_client",
                                                        "_generated"))


setup(cmdclass={"build_py": BuildWithStubs})
