"""A python model split over files in its folder: model.py imports its siblings relatively, each
model's files stay its own, and the folder never goes on sys.path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from wok.errors import ConfigError
from wok.repository import ModelRepository, load_servable

CPU = torch.device("cpu")

CONFIG = """\
platform = "python"
factory = "{factory}"
max_batch_size = 4

[[inputs]]
name = "INPUT0"
datatype = "FP32"
dims = [2]

[[outputs]]
name = "OUTPUT0"
datatype = "FP32"
dims = [2]

[instances]
devices = ["cpu"]
"""

MODEL = """\
from torch import nn

{import_line}


class M(nn.Module):
    def forward(self, x):
        return head(x)


def build():
    return M()
"""


def model_folder(root: Path, name: str, files: dict[str, str], factory: str = "model:build") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.toml").write_text(CONFIG.format(factory=factory))
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(textwrap.dedent(text))
    return d


def answer(servable, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return servable.forward(servable.module_for(CPU), {"INPUT0": x})["OUTPUT0"]


@pytest.mark.parametrize("import_line", ["from .layers import head", "from . import layers\nhead = layers.head"])
def test_model_py_imports_a_sibling_file_relatively(tmp_path, import_line):
    # It was "attempted relative import with no known parent package".
    d = model_folder(
        tmp_path,
        "m",
        {"model.py": MODEL.format(import_line=import_line), "layers.py": "def head(x):\n    return x + 1\n"},
    )
    x = torch.ones(3, 2)
    torch.testing.assert_close(answer(load_servable(d), x), x + 1)


def test_two_models_each_with_a_layers_py_keep_their_own(tmp_path):
    for name, body in (("plus", "x + 1"), ("times", "x * 10")):
        model_folder(
            tmp_path,
            name,
            {
                "model.py": MODEL.format(import_line="from .layers import head"),
                "layers.py": f"def head(x):\n    return {body}\n",
            },
        )
    repo = ModelRepository.from_directory(tmp_path)
    x = torch.ones(2, 2)
    torch.testing.assert_close(answer(repo.get("plus"), x), x + 1)
    torch.testing.assert_close(answer(repo.get("times"), x), x * 10)
    assert "layers" not in sys.modules


def test_the_model_folder_is_not_put_on_sys_path(tmp_path):
    # An absolute import finds installed modules only: a stray layers.py is not picked up that way.
    d = model_folder(
        tmp_path,
        "m",
        {
            "model.py": MODEL.format(import_line="from wok_test_sibling_layers import head"),
            "wok_test_sibling_layers.py": "def head(x):\n    return x\n",
        },
    )
    before = list(sys.path)
    packages = {n for n in sys.modules if n.startswith("wok_model_")}
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: factory 'model:build': cannot import {str(d / 'model.py')!r}: ModuleNotFoundError: "
        "No module named 'wok_test_sibling_layers'"
    )
    assert sys.path == before
    assert {n for n in sys.modules if n.startswith("wok_model_")} == packages  # the failed model's package is gone


def test_a_dotted_factory_module_in_a_subfolder_imports_relatively_too(tmp_path):
    d = model_folder(
        tmp_path,
        "m",
        {
            "nets/model.py": MODEL.format(import_line="from ..layers import head"),
            "layers.py": "def head(x):\n    return x * 3\n",
        },
        factory="nets.model:build",
    )
    x = torch.ones(2, 2)
    torch.testing.assert_close(answer(load_servable(d), x), x * 3)


@pytest.mark.parametrize("init", ["from .model import build\n", "from model import build\n", "raise RuntimeError\n"])
def test_an_init_py_in_the_model_folder_is_not_run(tmp_path, init, monkeypatch):
    # Run as the package's init, it imported model.py a second time, or failed on an import that
    # loaded before model folders were packages.
    import builtins

    model = "import builtins\nbuiltins.WOK_TEST_RUNS += 1\n" + MODEL.format(import_line="from .layers import head")
    d = model_folder(
        tmp_path, "m", {"model.py": model, "layers.py": "def head(x):\n    return x - 1\n", "__init__.py": init}
    )
    monkeypatch.setattr(builtins, "WOK_TEST_RUNS", 0, raising=False)
    x = torch.ones(2, 2)
    torch.testing.assert_close(answer(load_servable(d), x), x - 1)
    assert builtins.WOK_TEST_RUNS == 1
