"""Python client for praxis-serve, the gRPC server of the Praxis video transformer.

    from praxis_client import Client
    with Client("127.0.0.1:50051") as c:
        r = c.step(text=..., anchor=..., noised=..., clean=..., timesteps=...)
        velocity = r.tensors["velocity"]

`pb` is the generated praxis.v1 message module (praxis_client._proto.praxis_pb2). On the command
line: python -m praxis_client health|info|step (see praxis_client.__main__).
"""
from praxis_client._proto import praxis_pb2 as pb
from praxis_client.client import Client, Session
from praxis_client.errors import PraxisError, ProtocolError, RpcFailed, StepFailed
from praxis_client.request import LAYOUT_HEADER, layout_key, make_request
from praxis_client.response import StepAssembler, StepResult, assemble

__all__ = ["LAYOUT_HEADER", "Client", "PraxisError", "ProtocolError", "RpcFailed", "Session",
           "StepAssembler", "StepFailed", "StepResult", "assemble", "layout_key", "make_request",
           "pb"]
