"""Generate the Python stubs for proto/ into server/v2pb (the import package wok.v2pb).

    python scripts/gen_protos.py [OUT_DIR]

tests/server/test_v2pb_drift.py runs this into a temporary folder and fails when the
committed stubs differ, so regenerate and commit after editing a .proto.
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
        written = []
        for src in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            dst = out_dir / src.name
            dst.write_bytes(src.read_bytes())
            written.append(dst)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
