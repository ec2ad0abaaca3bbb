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


def wok_imported() -> bool:
    """Whether this process has imported wok: a peer must be a Triton user's process, with nothing of wok."""
    return any(m == "wok" or m.startswith("wok.") for m in sys.modules)


def finish(peer, name: str, shown) -> int:
    """The end of a peer's run: its report's verdict written, each failed call printed (`shown(call)`); 0 or 1."""
    failed = [c for c in peer.report["calls"] if not c["ok"]]
    peer.report["ok"] = not failed
    peer.write()
    if failed:
        print(f"{name}: {len(failed)} call(s) failed:", file=sys.stderr)
        for c in failed:
            print(f"  {shown(c)}", file=sys.stderr)
        return 1
    return 0


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
