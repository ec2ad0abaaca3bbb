"""The committed stubs in server/v2pb must be exactly what proto/ generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_stubs_match_proto_sources(tmp_path):
    gen = _generator()
    fresh = {p.name: p.read_bytes() for p in gen.generate(tmp_path)}
    committed_dir = ROOT / "server" / "v2pb"
    committed = {
        p.name: p.read_bytes()
        for p in committed_dir.iterdir()
        if p.suffix in (".py", ".pyi") and p.name != "__init__.py"
    }
    assert sorted(fresh) == sorted(committed), "generated file set differs; run python scripts/gen_protos.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{stale} differ from proto/; run python scripts/gen_protos.py and commit"


def test_wire_names_are_tritons():
    """Package, service and method names are what Triton's clients call."""
    from wok.v2pb import grpc_service_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    assert {m.name for m in service.methods} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        # Declared so that wok answers them itself (UNIMPLEMENTED, saying why), not gRPC's "Method not found!".
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        # Status lists no region, unregistering succeeds, registering is UNIMPLEMENTED naming the region.
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    }
    stream = service.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming


def test_stubs_keep_their_types_out_of_the_default_pool():
    """tritonclient's stubs put the same `inference.*` names in protobuf's default pool."""
    from google.protobuf import descriptor_pool

    from wok.v2pb import _pool, model_config_pb2
    from wok.v2pb import grpc_service_pb2 as pb

    assert pb.DESCRIPTOR.pool is _pool.POOL and model_config_pb2.DESCRIPTOR.pool is _pool.POOL
    assert pb.ModelInferRequest.DESCRIPTOR.file is pb.DESCRIPTOR
    for name in (pb.DESCRIPTOR.name, model_config_pb2.DESCRIPTOR.name):
        try:
            descriptor_pool.Default().FindFileByName(name)
        except KeyError:
            continue
        raise AssertionError(f"{name} is in protobuf's default pool; expected it only in wok.v2pb._pool.POOL")
