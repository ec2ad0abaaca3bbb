"""Set up a virtual environment for wok from nothing but Python and pip, then run a command in it.

    python3 scripts/bootstrap.py serve [wok serve options]   # install, then start the server
    python3 scripts/bootstrap.py test  [pytest options]      # install with test extras, then run the suite

Torch is installed first and on its own: a machine without an NVIDIA GPU gets the CPU
build (the plain PyPI wheel for Linux x86-64 is a multi-GB CUDA build). Set WOK_TORCH to
override the requirement (for example ``WOK_TORCH="torch==2.13.0"``), WOK_VENV to choose
the environment's folder (default ``.venv`` in the checkout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ensure_venv(path: Path) -> Path:
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(path)
    return python


def pip(python: Path, *args: str) -> None:
    run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args])


def ensure_torch(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        return
    spec = os.environ.get("WOK_TORCH", f"torch=={TORCH_VERSION}")
    if has_nvidia_gpu():
        pip(python, spec)
        return
    # The CPU index carries "+cpu" builds, which pip prefers over PyPI's CUDA build of the
    # same version; where that index cannot be reached, a local CPU wheel (find-links) still wins.
    pip(python, "--extra-index-url", CPU_INDEX, "--retries", "1", spec)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"serve", "test", "install"}:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    python = ensure_venv(Path(os.environ.get("WOK_VENV", ROOT / ".venv")))
    ensure_torch(python)
    extras = "[test]" if command == "test" else ""
    pip(python, "-e", f"{ROOT}{extras}")
    env = dict(os.environ)
    if command == "serve":
        return subprocess.call([str(python), "-m", "wok", "serve", *rest], env=env)
    if command == "test":
        return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
