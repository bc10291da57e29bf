"""Python client for praxis-serve, the gRPC server of the Praxis video transformer.

    from praxis_client import Client
    with Client("127.0.0.1:50051") as c:
        r = c.step(text=..., anchor=..., noised=..., clean=..., timesteps=...)
        velocity = r.tensors["velocity"]

The protobuf stubs are generated on first import where the installed package carries none; see
praxis_client._stubs.
"""
from praxis_client.client import (LAYOUT_HEADER, Client, PraxisError, ProtocolError, RpcFailed,
                                  Session, StepAssembler, StepFailed, StepResult, assemble,
                                  layout_key, make_request, pb)

__all__ = ["LAYOUT_HEADER", "Client", "PraxisError", "ProtocolError", "RpcFailed", "Session",
           "StepAssembler", "StepFailed", "StepResult", "assemble", "layout_key", "make_request",
           "pb"]
