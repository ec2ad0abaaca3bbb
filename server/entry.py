"""The `wok` console script's entry point (pyproject.toml), and `python -m wok`'s (server/__main__.py
hands over to it). The command's own module imports gRPC and
asyncio first, about 0.1 s before its `main` takes over SIGINT: a Ctrl-C then ended in a
KeyboardInterrupt traceback. Here it ends as a Ctrl-C a moment later does, one line and status 130.
Nothing but `sys` is imported before the guard."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .__main__ import main as run

        return run()
    except KeyboardInterrupt:  # only one that `run` did not handle itself: before its own guard
        print("wok: interrupted", file=sys.stderr)
        return 130
