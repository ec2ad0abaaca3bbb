"""What the tritonclient peers (triton_peer.py, datatypes_peer.py) share. Imported by them as a sibling
module: they run as scripts, with nothing of wok loaded, exactly as a Triton user's client runs."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from tritonclient.utils import InferenceServerException


def describe(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return f"InferenceServerException(status={exc.status()}, message={exc.message()!r})"
    return f"{type(exc).__name__}: {exc}"


def tritonclient_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonclient")
    except PackageNotFoundError:
        return None


def main(peer_class, argv: list[str], name: str) -> int:
    """Run `peer_class(TARGET, OUTDIR).run()`; a crash is written into its report and exits 1."""
    if len(argv) != 3:
        print(f"usage: {name} TARGET OUTDIR", file=sys.stderr)
        return 2
    outdir = Path(argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    peer = peer_class(argv[1], outdir)
    try:
        return peer.run()
    except Exception:
        peer.report["ok"] = False
        peer.report["crash"] = traceback.format_exc()
        peer.write()
        print(f"{name.removesuffix('.py')}: crashed:\n" + traceback.format_exc(), file=sys.stderr)
        return 1
