"""A stock grpcio client of the runner, for sidecar/tests/interop.rs.

Nothing here adapts to the runner: the channel is the one any Python user
would open (`grpc.insecure_channel("unix://" + path)` or "127.0.0.1:PORT"),
with no options, no `:authority` override and no custom metadata.

  grpc_client.py stubs PROTO TARGET   stubs generated now by grpc_tools.protoc
  grpc_client.py reflect TARGET       everything learnt from server reflection

Each prints one JSON object on stdout; any failure raises (non-zero exit,
traceback on stderr).
"""

import importlib
import json
import os
import sys
import tempfile

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

RUNNER = "agentplane.runner.v1.Runner"


def health(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    out = {}
    for service in ("", RUNNER):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        out[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return out


def with_stubs(proto, target):
    from grpc_tools import protoc

    out_dir = tempfile.mkdtemp(prefix="runner-stubs-")
    proto_dir, name = os.path.split(os.path.abspath(proto))
    # protoc's own well-known types ship inside grpc_tools.
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{wkt}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            name,
        ]
    )
    if rc != 0:
        raise SystemExit(f"grpc_tools.protoc failed with {rc}")
    sys.path.insert(0, out_dir)
    module = os.path.splitext(name)[0]
    pb2 = importlib.import_module(f"{module}_pb2")
    pb2_grpc = importlib.import_module(f"{module}_pb2_grpc")

    with grpc.insecure_channel(target) as channel:
        result = {"target": target, "health": health(channel)}
        stub = pb2_grpc.RunnerStub(channel)
        resp = stub.Run(
            pb2.RunRequest(
                id="interop-python-1",
                name="bash",
                input_json=json.dumps({"command": "echo hi"}),
            ),
            timeout=30,
        )
        result["run"] = {"content": resp.content, "is_error": resp.is_error}
        # Many calls on one connection: later header blocks refer to (and
        # evict from) the client's HPACK dynamic table.
        result["echoes"] = [
            stub.Run(
                pb2.RunRequest(
                    id=f"interop-python-echo-{i}",
                    name="bash",
                    input_json=json.dumps({"command": f"echo {i}"}),
                ),
                timeout=30,
            ).content
            for i in range(40)
        ]
        tools = stub.ListTools(pb2.ListToolsRequest(), timeout=10)
        result["tools"] = [t.name for t in tools.tools]
        # A refusal must arrive as a status with its metadata, unchanged.
        try:
            stub.Run(pb2.RunRequest(id="x", name="web_fetch", input_json="{}"), timeout=10)
            result["refusal"] = None
        except grpc.RpcError as e:
            md = dict(e.trailing_metadata() or ())
            result["refusal"] = {
                "code": e.code().name,
                "agentplane-refusal": md.get("agentplane-refusal"),
            }
    return result


def with_reflection(target):
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = sorted(db.get_services())
        pool = descriptor_pool.DescriptorPool(db)
        svc = pool.FindServiceByName(RUNNER)
        methods = {}
        for m in svc.methods:
            methods[m.name] = {
                "input": m.input_type.full_name,
                "output": m.output_type.full_name,
            }
        health_svc = pool.FindServiceByName("grpc.health.v1.Health")
        # Call Run with message classes built from the reflected schema only.
        run = svc.FindMethodByName("Run")
        req_cls = message_factory.GetMessageClass(run.input_type)
        resp_cls = message_factory.GetMessageClass(run.output_type)
        call = channel.unary_unary(
            f"/{RUNNER}/Run",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        resp = call(
            req_cls(
                id="interop-reflect-1",
                name="bash",
                input_json=json.dumps({"command": "echo reflected"}),
            ),
            timeout=30,
        )
        return {
            "target": target,
            "services": services,
            "runner_methods": methods,
            "runner_file": svc.file.name,
            "health_methods": sorted(m.name for m in health_svc.methods),
            "run": {"content": resp.content, "is_error": resp.is_error},
        }


def main(argv):
    if len(argv) == 4 and argv[1] == "stubs":
        result = with_stubs(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "reflect":
        result = with_reflection(argv[2])
    else:
        raise SystemExit(__doc__)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv)
