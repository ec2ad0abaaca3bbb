"""Which input goes to which parameter of a model's forward: by name where forward's parameters are
named exactly as the config's inputs, else by the config's order."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from wok.config import model_config_from_dict
from wok.repository import load_servable
from wok.servable import Servable

CPU = torch.device("cpu")
# torch 2.13 deprecates torch.jit, but the torchscript platform is still served.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

MINUEND = torch.tensor([[10.0, 10.0]])
SUBTRAHEND = torch.tensor([[1.0, 2.0]])


class Sub(nn.Module):
    def forward(self, minuend, subtrahend):
        return minuend - subtrahend


def config(names: list[str]) -> dict:
    return {
        "name": "sub",
        "platform": "python",
        "factory": "tests:unused",
        "inputs": [{"name": n, "datatype": "FP32", "dims": [2]} for n in names],
        "outputs": [{"name": "difference", "datatype": "FP32", "dims": [2]}],
        "max_batch_size": 4,
    }


def answer(s: Servable, **inputs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return s.forward(s.module_for(CPU), inputs)["difference"]


def write_model(root: Path, body: str, names: list[str], platform: str = "python", **extra) -> Path:
    d = root / "sub"
    d.mkdir()
    lines = [f'platform = "{platform}"', "max_batch_size = 4"]
    lines += [f'{k} = "{v}"' for k, v in extra.items()]
    for n in names:
        lines += ["", "[[inputs]]", f'name = "{n}"', 'datatype = "FP32"', "dims = [2]"]
    lines += ["", "[[outputs]]", 'name = "difference"', 'datatype = "FP32"', "dims = [2]"]
    (d / "config.toml").write_text("\n".join(lines) + "\n")
    if body:
        (d / "model.py").write_text(textwrap.dedent(body))
    return d


def test_inputs_listed_in_another_order_than_forward_takes_them_reach_it_by_name(tmp_path):
    # forward(self, minuend, subtrahend), the config listing subtrahend first: it answered [-9, -8].
    d = write_model(
        tmp_path,
        """
        from torch import nn


        class Sub(nn.Module):
            def forward(self, minuend, subtrahend):
                return minuend - subtrahend


        def build():
            return Sub()
        """,
        ["subtrahend", "minuend"],
        factory="model:build",
    )
    s = load_servable(d)
    torch.testing.assert_close(answer(s, minuend=MINUEND, subtrahend=SUBTRAHEND), torch.tensor([[9.0, 8.0]]))


@pytest.mark.parametrize("order", [["minuend", "subtrahend"], ["subtrahend", "minuend"]])
def test_a_torchscript_model_takes_its_inputs_by_the_names_in_its_schema(tmp_path, order):
    d = write_model(tmp_path, "", order, platform="torchscript", model_file="sub.pt")
    torch.jit.script(Sub()).save(str(d / "sub.pt"))
    s = load_servable(d)
    torch.testing.assert_close(answer(s, minuend=MINUEND, subtrahend=SUBTRAHEND), torch.tensor([[9.0, 8.0]]))


def test_a_torch_export_model_takes_its_inputs_by_name(tmp_path):
    d = write_model(tmp_path, "", ["subtrahend", "minuend"], platform="torch_export", model_file="sub.pt2")
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(Sub(), (torch.ones(2, 2), torch.ones(2, 2)), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(d / "sub.pt2"))
    s = load_servable(d)
    torch.testing.assert_close(answer(s, minuend=MINUEND, subtrahend=SUBTRAHEND), torch.tensor([[9.0, 8.0]]))


@pytest.mark.parametrize("order", [["minuend", "subtrahend"], ["subtrahend", "minuend"]])
def test_a_torch_export_model_whose_short_batches_are_padded_takes_its_inputs_by_name(tmp_path, caplog, order):
    # From 2 rows (Dim.AUTO): a one-row batch is padded, the config's order put into the program's.
    d = write_model(tmp_path, "", order, platform="torch_export", model_file="sub.pt2")
    auto = torch.export.Dim.AUTO
    program = torch.export.export(Sub(), (torch.ones(3, 2), torch.ones(3, 2)), dynamic_shapes=({0: auto}, {0: auto}))
    torch.export.save(program, str(d / "sub.pt2"))
    caplog.set_level(logging.INFO, logger="wok")
    s = load_servable(d)
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [
        "model 'sub': inputs 'minuend', 'subtrahend' of its torch.export program take batches of 2 rows or more: "
        "batches of fewer than 2 rows are padded to 2, copies of their first row, the copies' answers dropped"
    ]
    seen = []
    program = next(m for m in s.module_for(CPU).modules() if isinstance(m, torch.fx.GraphModule))
    program.register_forward_pre_hook(lambda _module, args: seen.append([list(a.shape) for a in args]))
    torch.testing.assert_close(answer(s, minuend=MINUEND, subtrahend=SUBTRAHEND), torch.tensor([[9.0, 8.0]]))
    assert seen == [[[2, 2], [2, 2]]]


class Named(nn.Module):
    """forward(self, a, b): answers a - b."""

    def forward(self, a, b):
        return a - b


class VarArgs(nn.Module):
    def forward(self, minuend, subtrahend, *rest, **options):
        return minuend - subtrahend


class Defaults(nn.Module):
    def forward(self, minuend, subtrahend, mask=None, *, scale=1.0):
        return (minuend - subtrahend) * scale


class ScriptedDefaults(nn.Module):
    def forward(self, minuend, subtrahend, scale: float = 1.0):
        return (minuend - subtrahend) * scale


class Required(nn.Module):
    def forward(self, minuend, subtrahend, mask):  # a third input the config does not name: unchanged
        return minuend - subtrahend


class ScriptedThis(nn.Module):
    """forward's first parameter, the module, named otherwise than self: TorchScript's schema keeps the name."""

    def forward(this, minuend, subtrahend):
        return minuend - subtrahend


class Star(nn.Module):
    def forward(self, *tensors):
        return tensors[0] - tensors[1]


@pytest.mark.parametrize(
    ("module", "names", "order"),
    [
        (Sub(), ["subtrahend", "minuend"], ["minuend", "subtrahend"]),  # the same names: forward's order
        (Sub(), ["minuend", "subtrahend"], ["minuend", "subtrahend"]),
        (VarArgs(), ["subtrahend", "minuend"], ["minuend", "subtrahend"]),  # *rest, **options are no inputs
        (Named(), ["INPUT1", "INPUT0"], ["INPUT1", "INPUT0"]),  # other names: the config's order, as before
        (Named(), ["b", "x"], ["b", "x"]),  # only some names match: the config's order
        (Defaults(), ["subtrahend", "minuend"], ["minuend", "subtrahend"]),  # the rest have defaults
        (torch.jit.script(ScriptedDefaults()), ["subtrahend", "minuend"], ["minuend", "subtrahend"]),
        # The schema's module argument was dropped only when named self: `this` took the first name's place.
        (torch.jit.script(ScriptedThis()), ["subtrahend", "minuend"], ["minuend", "subtrahend"]),
        (Required(), ["subtrahend", "minuend"], ["subtrahend", "minuend"]),
        (Star(), ["subtrahend", "minuend"], ["subtrahend", "minuend"]),  # no names at all
        (nn.Identity(), ["input"], ["input"]),
    ],
)
def test_forward_order(module, names, order):
    from wok.servable import forward_order

    assert forward_order(module, names) == order


def test_inputs_named_otherwise_than_forward_s_parameters_go_in_config_order():
    s = Servable(model_config_from_dict(config(["SECOND", "FIRST"]), "test"), Named())
    # a = SECOND, b = FIRST: the config's order, whatever the names.
    torch.testing.assert_close(answer(s, SECOND=MINUEND, FIRST=SUBTRAHEND), torch.tensor([[9.0, 8.0]]))


def test_an_input_named_as_another_of_forward_s_parameters_is_warned_of(tmp_path, caplog):
    # forward(minuend, subtrahend), a typo in the config's second input: inputs go by position, the config's
    # 'subtrahend' into minuend, and the model answers minus the difference with no error at all.
    d = write_model(tmp_path, "", ["subtrahend", "minuends"], platform="torchscript", model_file="sub.pt")
    torch.jit.script(Sub()).save(str(d / "sub.pt"))
    caplog.set_level(logging.WARNING, logger="wok")
    s = load_servable(d)
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == [
        "model 'sub': input 'subtrahend' goes to forward's parameter 'minuend', by the config's order: inputs "
        "reach forward by name only where its first parameters are named exactly as the config's inputs and any "
        "after them have defaults (forward takes minuend, subtrahend); name the inputs as forward's parameters, "
        f"or list them in its order (config: {d / 'config.toml'})"
    ]
    # Served as documented, all the same.
    torch.testing.assert_close(answer(s, subtrahend=SUBTRAHEND, minuends=MINUEND), SUBTRAHEND - MINUEND)


@pytest.mark.parametrize(
    "names",
    [["subtrahend", "minuend"], ["INPUT0", "INPUT1"], ["minuend", "INPUT1"]],  # by name; none named; in its place
)
def test_inputs_by_name_or_each_in_its_parameter_s_place_are_not_warned_of(names, caplog):
    caplog.set_level(logging.WARNING, logger="wok")
    Servable(model_config_from_dict(config(names), "test"), Sub())
    assert [r.getMessage() for r in caplog.records if r.name == "wok"] == []
