"""Generate the Python stubs for proto/ into server/v2pb (the import package wok.v2pb).

    python scripts/gen_protos.py [OUT_DIR]

tests/server/test_v2pb_drift.py runs this into a temporary folder and fails when the
committed stubs differ, so regenerate and commit after editing a .proto.

The `_pb2.py` files protoc writes add their descriptors to protobuf's default pool, where
tritonclient's generated code adds the same `inference.*` names: importing both in one
process then fails with "duplicate symbol". Type names never go on the wire (only the
`/inference.GRPCInferenceService/...` paths and the serialized messages do), so the stubs
are rewritten to add their files to a pool of wok's own, `wok.v2pb._pool.POOL`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("wok") / "v2pb"
SOURCES = ["model_config.proto", "grpc_service.proto"]
DEFAULT_OUT = ROOT / "server" / "v2pb"

POOL_MODULE = "_pool.py"
POOL_SOURCE = '''\
"""The descriptor pool that wok's generated stubs (wok.v2pb) add their files to.

Written by scripts/gen_protos.py. Not protobuf's default pool: tritonclient's stubs add the
same `inference.*` names there, and a process may import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
'''
# What protoc writes in each _pb2.py, and what it becomes.
DEFAULT_POOL_ADD = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL_ADD = "DESCRIPTOR = _POOL.AddSerializedFile("
IMPORTS_END = "# @@protoc_insertion_point(imports)\n"
POOL_IMPORT = "from wok.v2pb._pool import POOL as _POOL\n"


def use_private_pool(source: str, name: str) -> str:
    """The _pb2.py text `source` (of file `name`), adding its descriptors to wok's pool."""
    for marker in (DEFAULT_POOL_ADD, IMPORTS_END):
        if source.count(marker) != 1:
            raise RuntimeError(
                f"{name}: expected {marker.strip()!r} once in protoc's output, found it "
                f"{source.count(marker)} times; has the protoc version changed what it writes?"
            )
    source = source.replace(DEFAULT_POOL_ADD, PRIVATE_POOL_ADD)
    return source.replace(IMPORTS_END, IMPORTS_END + "\n" + POOL_IMPORT)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) and move the results into out_dir; returns the files."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(PACKAGE_DIR / s) for s in SOURCES],
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        pool = out_dir / POOL_MODULE
        pool.write_text(POOL_SOURCE)
        written = [pool]
        for src in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            dst = out_dir / src.name
            if src.name.endswith("_pb2.py"):
                dst.write_text(use_private_pool(src.read_text(), src.name))
            else:
                dst.write_bytes(src.read_bytes())
            written.append(dst)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
