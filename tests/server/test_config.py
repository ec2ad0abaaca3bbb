"""Each config rule fails the load with a ConfigError naming the file, the field and what was got.

Configs are written to real folders and read with `load_model_config`, the path a server
takes, so the file name in the message is the one a user would have to open.
"""

from __future__ import annotations

import json
import math
import re
import typing
from pathlib import Path

import pytest
import torch
import yaml

from wok.config import (
    DEVICE_FORMS,
    ModelConfig,
    _describe,
    check_device,
    load_model_config,
    model_config_from_dict,
    server_settings,
)
from wok.errors import ConfigError, quoted_name

from ..conftest import python_model_config

# A valid python-platform config; each test breaks one thing in it.
BASE = {
    "platform": "python",
    "factory": "model:build",
    "max_batch_size": 8,
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3]}],
    "dynamic_batching": {"max_queue_delay_ms": 2.0, "preferred_batch_sizes": [4, 8]},
    "instances": {"count": 2, "devices": ["cpu"]},
    "parameters": {"hidden": 16, "scale": 0.5, "act": "relu", "bias": True},
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def to_toml(data: dict) -> str:
    """Just enough TOML for these configs: scalars, arrays, inline tables."""
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in data.items())


def write_model(root: Path, data: dict, name: str = "m", filename: str = "config.toml") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    text = to_toml(data) if filename.endswith(".toml") else yaml.safe_dump(data)
    (d / filename).write_text(text)
    return d


def changed(**changes) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    data.update(changes)
    return data


def load_error(tmp_path: Path, data: dict, filename: str = "config.toml") -> tuple[str, Path]:
    d = write_model(tmp_path, data, filename=filename)
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    return str(info.value), d / filename


def test_base_config_is_valid(tmp_path):
    # Guards the other tests: each failure below is due to its one change, not to BASE.
    cfg = load_model_config(write_model(tmp_path, BASE))
    assert cfg.platform == "python" and cfg.max_batch_size == 8
    assert cfg.dynamic_batching.preferred_batch_sizes == (4, 8)
    assert cfg.parameters == {"hidden": 16, "scale": 0.5, "act": "relu", "bias": True}
    assert cfg.instances.devices == ("cpu",)


def test_unknown_datatype(tmp_path):
    msg, path = load_error(tmp_path, changed(inputs=[{"name": "INPUT0", "datatype": "FP33", "dims": [4]}]))
    assert msg.startswith(f"{path}: ")
    assert "inputs.0.datatype" in msg
    assert "expected a V2 datatype, one of BOOL, " in msg and msg.endswith("; got 'FP33'")
    assert "FP32" in msg  # the accepted names are listed


def test_zero_dim(tmp_path):
    msg, path = load_error(tmp_path, changed(outputs=[{"name": "OUTPUT0", "datatype": "FP32", "dims": [3, 0]}]))
    assert msg.startswith(f"{path}: ")
    assert "outputs.0.dims" in msg
    assert "-1 (variable) or >= 1" in msg
    assert "[3, 0]" in msg


def test_variable_dim_is_accepted(tmp_path):
    cfg = load_model_config(
        write_model(tmp_path, changed(inputs=[{"name": "INPUT0", "datatype": "INT64", "dims": [-1]}]))
    )
    assert cfg.inputs[0].variable


def test_negative_queue_delay(tmp_path):
    msg, path = load_error(tmp_path, changed(dynamic_batching={"max_queue_delay_ms": -1.5}))
    assert msg.startswith(f"{path}: ")
    assert "dynamic_batching.max_queue_delay_ms" in msg
    assert "expected >= 0; got -1.5" in msg


def test_zero_max_batch_size(tmp_path):
    msg, path = load_error(tmp_path, changed(max_batch_size=0, dynamic_batching={"max_queue_delay_ms": 1.0}))
    assert msg.startswith(f"{path}: ")
    # Triton's max_batch_size = 0 (no batching) has no meaning here: the message says what to give instead.
    assert msg == (
        f"{path}: max_batch_size: expected >= 1 (wok always batches along the first dim; Triton's 0, no batching, "
        "is not supported: give max_batch_size >= 1 and leave the batch dim out of dims); got 0"
    )


@pytest.mark.parametrize(
    ("value", "got"),
    [([10], "a list"), ({"n": 10}, "a table")],
)
def test_a_parameter_of_another_type_is_one_error_not_one_per_accepted_type(tmp_path, value, got):
    # It was four: parameters.classes.str, .int, .float and .bool, each "Input should be a valid ...".
    msg, path = load_error(tmp_path, changed(parameters={"classes": value, "hidden": 16}))
    assert msg == f"{path}: parameters.classes: expected a string, number or boolean; got {got}"


def test_a_parameter_named_as_the_servers_published_ones_is_refused(tmp_path):
    # The ModelConfig answer lists the config's parameters beside the server's wok.ids_bound.<input>: a config's own
    # would have been overwritten unseen, or read by `wok bench ramp` as a bound the server found.
    # YAML: TOML reads the dotted key unquoted as tables (refused as a table, not a number).
    msg, path = load_error(tmp_path, changed(parameters={"wok.ids_bound.x": 5, "hidden": 16}), "config.yaml")
    assert msg == (
        f"{path}: parameters: keys starting with 'wok.' are kept for what the server publishes in its ModelConfig "
        'answer (wok.ids_bound.<input>); expected other keys; got ["wok.ids_bound.x"]'
    )


def test_preferred_batch_size_above_max(tmp_path):
    msg, path = load_error(tmp_path, changed(dynamic_batching={"preferred_batch_sizes": [4, 16]}))
    assert msg.startswith(f"{path}: ")
    assert msg == (
        f"{path}: (top level): dynamic_batching.preferred_batch_sizes: expected sizes from 1 to max_batch_size (8); "
        "got 16"
    )


def test_python_platform_without_factory(tmp_path):
    data = changed()
    del data["factory"]
    msg, path = load_error(tmp_path, data)
    assert msg.startswith(f"{path}: ")
    assert "platform 'python' needs factory" in msg


def test_python_factory_without_callable(tmp_path):
    # "model" alone would import but name no callable; caught at config time, not at load.
    msg, _ = load_error(tmp_path, changed(factory="model"))
    assert "factory = 'module:callable'" in msg


def test_torchscript_without_model_file(tmp_path):
    data = changed(platform="torchscript")
    del data["factory"]
    msg, path = load_error(tmp_path, data)
    assert msg.startswith(f"{path}: ")
    assert "platform 'torchscript' needs model_file" in msg


def test_duplicate_input_names(tmp_path):
    inputs = [
        {"name": "INPUT0", "datatype": "FP32", "dims": [4]},
        {"name": "INPUT0", "datatype": "INT64", "dims": [2]},
    ]
    msg, path = load_error(tmp_path, changed(inputs=inputs))
    assert msg.startswith(f"{path}: ")
    assert "input names repeat" in msg
    assert msg.endswith('input names repeat: ["INPUT0"]')  # in the file's words, as "INPUT0" is


def test_misspelt_field_is_rejected(tmp_path):
    # A typo must not silently fall back to a default: max_batch_size is missing and the
    # misspelling is named.
    data = changed()
    data["max_batch_sise"] = data.pop("max_batch_size")
    msg, path = load_error(tmp_path, data)
    assert msg.startswith(f"{path}: ")
    assert "max_batch_sise: expected a known setting; got an unknown one, set to 8; did you mean max_batch_size?" in msg
    assert "max_batch_size: expected a value (the setting is required); got none" in msg


def test_misspelt_nested_field_is_rejected(tmp_path):
    msg, _ = load_error(tmp_path, changed(dynamic_batching={"max_queue_delay": 3}))
    assert (
        "dynamic_batching.max_queue_delay: expected a known setting; got an unknown one, set to 3; did you mean "
        "max_queue_delay_ms?"
    ) in msg


def test_a_top_level_key_written_after_a_table_is_named_as_one_of_the_top_level(tmp_path):
    # Appended to a file that ends in [[outputs]], a key belongs to the last output: it was refused
    # as "outputs.0.max_batch_size: Extra inputs are not permitted", with max_batch_size "required".
    d = tmp_path / "m"
    d.mkdir()
    # Without [dynamic_batching] and [instances] the text ends in the [[outputs]] table.
    (d / "config.toml").write_text(python_model_config(None, out_dims=3, devices=None) + "max_batch_size = 8\n")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: outputs.0.max_batch_size: expected a known setting; got an unknown one, set to 8; "
        "max_batch_size is a top-level setting: in TOML, every key after a [[outputs]] header belongs to it (write "
        "max_batch_size above the first header; in YAML, not indented); max_batch_size: expected a value (the "
        "setting is required); got none"
    )


def test_a_key_of_another_table_is_named_with_its_table(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    text = python_model_config(8, out_dims=3, devices=None) + "count = 2\n"  # after the [[outputs]] table
    (d / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: outputs.0.count: expected a known setting; got an unknown one, set to 2; count is a "
        "setting of instances: in TOML, every key after a [[outputs]] header belongs to it (write count under "
        "[instances]; in YAML, indented under instances)"
    )


def test_an_unknown_setting_like_no_other_has_no_hint(tmp_path):
    msg, path = load_error(tmp_path, changed(batching={"max_queue_delay_ms": 3}))
    assert msg == f"{path}: batching: expected a known setting; got an unknown table"


def test_bad_device_string(tmp_path):
    msg, path = load_error(tmp_path, changed(instances={"devices": ["cpu", "gpu:0"]}))
    assert msg.startswith(f"{path}: ")
    assert "instances.devices" in msg
    assert msg.endswith(f"expected {DEVICE_FORMS}; got 'gpu:0'")


@pytest.mark.parametrize("device", ["cuda:x", "cpu:0", ""])
def test_other_bad_devices(tmp_path, device):
    msg, _ = load_error(tmp_path, changed(instances={"devices": [device]}))
    assert msg.endswith(f"expected {DEVICE_FORMS}; got {device!r}")


def test_bad_toml_syntax(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.toml").write_text('platform = "python"\nmax_batch_size = = 8\n')
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    msg = str(info.value)
    assert msg.startswith(f"{d / 'config.toml'}: not valid TOML")
    assert "line 2" in msg  # tomllib's position survives, so the user can find it


def test_bad_yaml_syntax(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.yaml").write_text("platform: python\ninputs: [unclosed\n")
    with pytest.raises(ConfigError, match=re.escape(f"{d / 'config.yaml'}: not valid YAML")):
        load_model_config(d)


def test_a_yaml_key_given_twice_is_refused_as_toml_refuses_it(tmp_path):
    # PyYAML kept the last silently: max_batch_size 64, and the second dynamic_batching dropped the
    # first's max_queue_delay_ms (5.0, the default, served instead of 2.0).
    d = tmp_path / "m"
    d.mkdir()
    text = yaml.safe_dump(BASE, sort_keys=False) + "max_batch_size: 64\n"
    (d / "config.yaml").write_text(text)
    line = text.splitlines().index("max_batch_size: 8") + 1
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == (
        f"{d / 'config.yaml'}: not valid YAML: 'max_batch_size' is given twice, on lines {line} and "
        f"{len(text.splitlines())}"
    )
    nested = yaml.safe_dump(BASE, sort_keys=False).replace(
        "max_queue_delay_ms: 2.0", "max_queue_delay_ms: 2.0\n  max_queue_delay_ms: 3"
    )
    (d / "config.yaml").write_text(nested)
    with pytest.raises(ConfigError, match=re.escape("not valid YAML: 'max_queue_delay_ms' is given twice")):
        load_model_config(d)
    # A key a merge (`<<: *tensor`) brings may still be given again: that is what merges are for.
    text = yaml.safe_dump({k: v for k, v in BASE.items() if k != "outputs"}, sort_keys=False).replace(
        "inputs:\n- name: INPUT0", "inputs:\n- &tensor\n  name: INPUT0"
    )
    (d / "config.yaml").write_text(text + "outputs:\n- <<: *tensor\n  name: OUTPUT0\n")
    cfg = load_model_config(d)
    assert [(t.name, t.dims) for t in cfg.outputs] == [("OUTPUT0", (4,))]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"model_file": "model.pt"},
            "model_file only applies to platforms 'torchscript' and 'torch_export'; platform 'python' builds its "
            "module with factory",
        ),
        (
            {"platform": "torchscript", "model_file": "model.pt"},
            "factory and parameters only apply to platform 'python' (platform is 'torchscript', which loads "
            "model_file)",
        ),
        (
            {"platform": "torch_export", "model_file": "model.pt2", "factory": None},
            "parameters only applies to platform 'python' (platform is 'torch_export', which loads model_file)",
        ),
    ],
)
def test_a_setting_of_the_other_platform_is_refused_not_ignored(tmp_path, change, message):
    # Each was accepted and never read: a python model's model_file, a torchscript model's factory.
    data = {k: v for k, v in changed(**change).items() if v is not None}
    msg, path = load_error(tmp_path, data)
    assert msg == f"{path}: (top level): {message}"


def test_an_empty_yaml_config_is_named_so(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.yaml").write_text("# nothing yet\n")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == f"{d / 'config.yaml'}: expected a table of settings; got an empty document"


def test_config_that_is_not_a_table(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match=re.escape(f"{d / 'config.yaml'}: expected a table of settings; got list")):
        load_model_config(d)


@pytest.mark.parametrize("filename", ["config.yaml", "config.yml"])
def test_yaml_config_equals_toml(tmp_path, filename):
    from_toml = load_model_config(write_model(tmp_path / "a", BASE, name="m"))
    from_yaml = load_model_config(write_model(tmp_path / "b", BASE, name="m", filename=filename))
    # The same settings; each remembers its own file (ModelConfig.source), for errors found later.
    assert from_yaml.model_dump() == from_toml.model_dump()
    assert from_yaml.source.endswith(filename) and from_toml.source.endswith("config.toml")


def test_yaml_errors_name_the_yaml_file(tmp_path):
    msg, path = load_error(tmp_path, changed(max_batch_size=0), filename="config.yaml")
    assert msg.startswith(f"{path}: ")
    assert "max_batch_size" in msg


def test_two_config_files_rejected(tmp_path):
    d = write_model(tmp_path, BASE)
    write_model(tmp_path, BASE, filename="config.yaml")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == f"{d}: more than one config file: config.toml, config.yaml"


def test_no_config_file(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value).startswith(f"{d}: no config file; expected one of config.toml")


def test_folder_name_is_the_default_model_name(tmp_path):
    assert load_model_config(write_model(tmp_path, BASE, name="resnet-50.v2")).name == "resnet-50.v2"


def test_explicit_name_wins_over_folder_name(tmp_path):
    assert load_model_config(write_model(tmp_path, changed(name="other"), name="folder")).name == "other"


def test_a_folder_name_unfit_for_a_model_name_is_named_as_the_folders(tmp_path):
    # The config sets no name: it was refused as "name: String should match pattern ...", a setting
    # the file does not have.
    d = write_model(tmp_path, BASE, name="my model")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == (
        f"{d / 'config.toml'}: name: expected a model name of letters, digits, '_', '.' and '-' only (the config "
        "sets none, so its folder's: rename the folder, or set name in the config); got 'my model'"
    )
    assert load_model_config(write_model(tmp_path, changed(name="mine"), name="my model")).name == "mine"


@pytest.mark.parametrize("name", ["has space", "m\n", "é", "a/b"])
def test_a_name_unfit_for_a_model_name(tmp_path, name):
    # It was "String should match pattern '^[A-Za-z0-9_.\\-]+$'": the expected characters left to decode.
    # YAML: the helper's TOML does not escape a newline.
    msg, path = load_error(tmp_path, changed(name=name), filename="config.yaml")
    shown = quoted_name(name)
    assert msg == f"{path}: name: expected a model name of letters, digits, '_', '.' and '-' only; got {shown}"


@pytest.mark.parametrize("name", [".", ".."])
def test_a_model_name_that_urls_drop_as_a_path_segment_is_refused(tmp_path, name):
    # It loaded: /v2/models/../ready reaches the client's HTTP stack as /v2/ready, and
    # /v2/models/./ready asks for a model named 'ready'.
    msg, path = load_error(tmp_path, changed(name=name))
    assert msg == (
        f"{path}: name: expected a model name with a letter, digit, '_' or '-' (clients drop a name of dots alone "
        f"from a URL path: the V2 HTTP path /v2/models/{name}/ready is sent without it); got {quoted_name(name)}"
    )
    assert load_model_config(write_model(tmp_path / "ok", changed(name=".m."))).name == ".m."


def test_model_config_from_dict_names_its_source():
    with pytest.raises(ConfigError) as info:
        model_config_from_dict(changed(name="x", precision="fp64"), "inline source")
    msg = str(info.value)
    assert msg.startswith("inline source: ")
    assert "precision: expected 'fp32', 'fp16' or 'bf16'; got 'fp64'" in msg


def test_config_is_frozen(tmp_path):
    cfg = load_model_config(write_model(tmp_path, BASE))
    assert isinstance(cfg, ModelConfig)
    with pytest.raises(ValueError):
        cfg.max_batch_size = 4  # type: ignore[misc]


def test_server_settings_port_out_of_range():
    with pytest.raises(ConfigError) as info:
        server_settings(grpc_port=70000)
    msg = str(info.value)
    assert msg.startswith("server settings: ")
    assert "grpc_port" in msg
    assert "grpc_port: expected <= 65535; got 70000" in msg


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        # gRPC takes these as 32-bit ints (ms; the transport limit is 4 x max_request_bytes + 1 MiB):
        # past the bound the start used to fail after the models had loaded, with "value too large".
        ("max_request_bytes", 1 << 30, "536608767"),
        ("max_connection_age_s", 3e6, "2147483.647"),
        ("max_connection_age_grace_s", 3e6, "2147483.647"),
        ("grace_period_s", 3e6, "2147483.647"),
    ],
)
def test_server_settings_grpc_cannot_take_are_refused_up_front(field, value, bound):
    extra = {"max_connection_age_s": 60} if field == "max_connection_age_grace_s" else {}
    with pytest.raises(ConfigError) as info:
        server_settings(**{field: value}, **extra)
    assert str(info.value) == f"server settings: {field}: expected <= {bound}; got {value}"
    server_settings(max_request_bytes=536608767, max_connection_age_s=2147483, grace_period_s=2147483)  # at the bounds


@pytest.mark.parametrize("value", [0, -1])
def test_a_stream_window_under_one_request_is_refused(value):
    with pytest.raises(ConfigError) as info:
        server_settings(stream_window=value)
    assert str(info.value) == f"server settings: stream_window: expected >= 1; got {value}"
    assert server_settings(stream_window=1).stream_window == 1 and server_settings().stream_window == 1024


def test_demo_options_name_the_model_and_the_options_it_has():
    from wok.__main__ import _demo_options

    assert _demo_options(["mlp.hidden=64"]) == {"mlp": {"hidden": 64}}
    with pytest.raises(ConfigError) as info:
        _demo_options(["mlp.bogus=1"])
    assert str(info.value) == (
        "--demo-option 'mlp.bogus=1': demo model 'mlp' has no option 'bogus'; its options: in_features, hidden, "
        "out_features, layers, max_batch_size, max_queue_delay_ms, max_queue_size"
    )
    with pytest.raises(ConfigError, match=r"unknown demo model 'gpt'; known: mlp, recsys, encoder"):
        _demo_options(["gpt.layers=2"])
    assert _demo_options(["mlp.max_queue_delay_ms=0", "mlp.max_queue_delay_ms=0.5"]) == {
        "mlp": {"max_queue_delay_ms": 0.5}
    }


def test_demo_options_list_each_builders_keywords_and_their_types():
    # The list `--demo-option` checks without importing the builders (torch), held to them here.
    import inspect

    from wok.models import DEMO_MODELS, DEMO_OPTIONS

    assert list(DEMO_OPTIONS) == list(DEMO_MODELS)
    for name, options in DEMO_OPTIONS.items():
        params = inspect.signature(DEMO_MODELS[name]).parameters
        assert {k: p.annotation for k, p in params.items()} == {k: t.__name__ for k, t in options.items()}, name
        assert list(params) == list(options), name


def test_server_settings_unknown_field():
    with pytest.raises(
        ConfigError,
        match=re.escape("grpc_prot: expected a known setting; got an unknown one, set to 1; did you mean grpc_port?"),
    ):
        server_settings(grpc_prot=1)


def test_server_settings_defaults():
    s = server_settings(grpc_port=0)
    assert s.grpc_port == 0 and s.model_repository is None


def test_server_settings_connection_age_and_health_port():
    s = server_settings(grpc_port=8001, max_connection_age_s=30, max_connection_age_grace_s=0, health_port=8003)
    assert (s.max_connection_age_s, s.max_connection_age_grace_s, s.health_port) == (30, 0, 8003)
    assert s.health_host is None  # binds where the gRPC port does
    with pytest.raises(ConfigError, match=re.escape("max_connection_age_s: expected > 0; got 0")):
        server_settings(max_connection_age_s=0)
    with pytest.raises(ConfigError, match="max_connection_age_grace_s needs max_connection_age_s"):
        server_settings(max_connection_age_grace_s=5)
    with pytest.raises(ConfigError, match="health_port 8001 is the gRPC port"):
        server_settings(grpc_port=8001, health_port=8001)
    # On another address the same number is another socket; 0 always picks a free port.
    assert server_settings(grpc_port=8001, health_port=8001, health_host="10.0.0.1").health_port == 8001
    assert server_settings(grpc_port=0, health_port=0).health_port == 0
    # A name may be the other address, and a wildcard takes the port on every address.
    for host, health_host in (("127.0.0.1", "localhost"), ("0.0.0.0", "127.0.0.1"), ("::1", "::")):
        with pytest.raises(ConfigError, match=f"health_port 8001 is the gRPC port, on {re.escape(health_host)} and"):
            server_settings(grpc_port=8001, health_port=8001, host=host, health_host=health_host)


def test_addresses_take_ipv6_with_or_without_brackets():
    from wok.config import host_port

    s = server_settings(host="[::1]", metrics_host=" ::1 ", health_host="[fe80::1]")
    assert (s.host, s.metrics_host, s.health_host) == ("::1", "::1", "fe80::1")
    assert (host_port(s.host, 8001), host_port("127.0.0.1", 8001), host_port("localhost", 1)) == (
        "[::1]:8001",
        "127.0.0.1:8001",
        "localhost:1",
    )
    with pytest.raises(ConfigError, match=re.escape("host: expected an address or a host name; got '[]'")):
        server_settings(host="[]")


def test_server_settings_switch_interval():
    assert server_settings().switch_interval_ms is None  # Python's own 5 ms
    assert server_settings(switch_interval_ms=0.5).switch_interval_ms == 0.5
    with pytest.raises(ConfigError, match=re.escape("switch_interval_ms: expected > 0; got 0")):
        server_settings(switch_interval_ms=0)
    with pytest.raises(ConfigError, match=re.escape("switch_interval_ms: expected <= 100; got 500")):
        server_settings(switch_interval_ms=500)


def test_hand_written_toml_with_tables(tmp_path):
    # The documented layout ([[inputs]] tables, as python_model_config writes them) rather than the
    # inline form used above.
    d = tmp_path / "hand"
    d.mkdir()
    text = python_model_config(8, out_dims=3, dynamic_batching={"max_queue_delay_ms": 2.0}, devices=None)
    (d / "config.toml").write_text(text)
    cfg = load_model_config(d)
    assert cfg.name == "hand"
    assert cfg.inputs[0].dims == (4,) and cfg.outputs[0].dims == (3,)
    assert cfg.dynamic_batching.max_queue_delay_ms == 2.0


def test_server_settings_accept_tasks_and_wakeup_drain():
    s = server_settings()
    assert (s.accept_tasks, s.drain_wakeups) == (4, False)
    assert server_settings(accept_tasks=0, drain_wakeups=True).drain_wakeups
    with pytest.raises(ConfigError, match=re.escape("accept_tasks: expected >= 0; got -1")):
        server_settings(accept_tasks=-1)
    with pytest.raises(ConfigError, match=re.escape("accept_tasks: expected <= 64; got 65")):
        server_settings(accept_tasks=65)


def test_an_input_item_error_is_not_also_reported_as_a_list_too_short(tmp_path):
    # pydantic counts only the items that validated: the list's "at least 1 item" is a false error.
    msg, _ = load_error(tmp_path, changed(inputs=[{"name": "INPUT0", "datatype": "FLOAT32", "dims": [4]}]))
    assert "inputs.0.datatype: expected a V2 datatype" in msg and "got 'FLOAT32'" in msg
    assert "at least 1 item" not in msg
    msg, _ = load_error(tmp_path / "empty", changed(inputs=[]))
    assert "inputs: expected at least 1 item; got []" in msg  # an empty list still says so


def test_warmup_dims_replace_the_variable_dims_and_name_the_config_file(tmp_path):
    inputs = [{"name": "INPUT0", "datatype": "FP32", "dims": [2, -1], "warmup_dims": [2, 8]}]
    d = write_model(tmp_path, changed(inputs=inputs))
    cfg = load_model_config(d)
    assert cfg.inputs[0].warmup_shape() == (2, 8)
    assert cfg.outputs[0].warmup_shape() == (3,)
    assert cfg.source == str(d / "config.toml")
    plain = load_model_config(
        write_model(tmp_path / "p", changed(inputs=[{"name": "INPUT0", "datatype": "FP32", "dims": [2, -1]}]))
    )
    assert plain.inputs[0].warmup_shape() == (2, 1)


@pytest.mark.parametrize("warmup", [[3, 8], [2, 0], [2], [2, 8, 1], [2, -1]])
def test_warmup_dims_must_fit_the_declared_dims(tmp_path, warmup):
    inputs = [{"name": "INPUT0", "datatype": "FP32", "dims": [2, -1], "warmup_dims": warmup}]
    msg, path = load_error(tmp_path, changed(inputs=inputs))
    assert msg.startswith(f"{path}: inputs.0: ")
    assert f"warmup_dims {warmup} do not fit dims [2, -1]" in msg


def test_warmup_dims_on_an_output_are_refused(tmp_path):
    outputs = [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3], "warmup_dims": [3]}]
    msg, _ = load_error(tmp_path, changed(outputs=outputs))
    assert 'warmup_dims only apply to inputs; given for output(s) ["OUTPUT0"]' in msg


@pytest.mark.parametrize(
    ("change", "where", "got"),
    [
        ({"max_batch_size": "4"}, "max_batch_size", "'4'"),
        ({"max_batch_size": 4.0}, "max_batch_size", "4.0"),
        ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": ["4"]}]}, "inputs.0.dims.0", "'4'"),
        ({"instances": {"count": True}}, "instances.count", "true"),
        ({"dynamic_batching": {"max_queue_size": "64"}}, "dynamic_batching.max_queue_size", "'64'"),
        ({"dynamic_batching": {"max_queue_size": 64.0}}, "dynamic_batching.max_queue_size", "64.0"),
        ({"dynamic_batching": {"preferred_batch_sizes": [4.0]}}, "dynamic_batching.preferred_batch_sizes.0", "4.0"),
        ({"dynamic_batching": {"preferred_batch_sizes": ["4"]}}, "dynamic_batching.preferred_batch_sizes.0", "'4'"),
        ({"dynamic_batching": {"default_priority_level": True}}, "dynamic_batching.default_priority_level", "true"),
        ({"instances": {"pipeline_depth": "2"}}, "instances.pipeline_depth", "'2'"),
        ({"instances": {"pipeline_depth": 2.0}}, "instances.pipeline_depth", "2.0"),
        ({"instances": {"pipeline_depth": True}}, "instances.pipeline_depth", "true"),
    ],
)
def test_sizes_and_counts_are_integers_not_coerced_strings_floats_or_booleans(tmp_path, change, where, got):
    msg, path = load_error(tmp_path, changed(**change))
    assert msg == f"{path}: {where}: expected an integer; got {got}"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("grpc_port", "8001"),
        ("grpc_port", 8001.0),
        ("health_port", True),
        ("metrics_port", "8002"),
        ("max_request_bytes", 65536.0),
        ("torch_threads", "2"),
        ("accept_tasks", True),
        ("cpu_wakeup_latency_us", 0.0),
    ],
)
def test_server_settings_integers_are_not_coerced_from_strings_floats_or_booleans(field, value):
    with pytest.raises(ConfigError) as info:
        server_settings(**{field: value})
    assert str(info.value) == f"server settings: {field}: expected an integer; got {value!r}"


@pytest.mark.parametrize(
    ("change", "where", "got"),
    [
        ({"dynamic_batching": {"max_queue_delay_ms": "5"}}, "dynamic_batching.max_queue_delay_ms", "'5'"),
        ({"dynamic_batching": {"max_queue_delay_ms": True}}, "dynamic_batching.max_queue_delay_ms", "true"),
        ({"dynamic_batching": {"default_timeout_ms": "100"}}, "dynamic_batching.default_timeout_ms", "'100'"),
        ({"dynamic_batching": {"default_timeout_ms": False}}, "dynamic_batching.default_timeout_ms", "false"),
        (
            {"dynamic_batching": {"policy": "slo", "slo_ms": "50"}},
            "dynamic_batching.slo_ms",
            "'50'",
        ),
        (
            {"dynamic_batching": {"policy": "slo", "slo_ms": 50, "slo_quantile": "0.9"}},
            "dynamic_batching.slo_quantile",
            "'0.9'",
        ),
    ],
)
def test_times_are_numbers_not_coerced_strings_or_booleans(tmp_path, change, where, got):
    msg, path = load_error(tmp_path, changed(**change))
    assert msg == f"{path}: {where}: expected a number; got {got}"


def test_an_integer_time_is_taken_as_a_float(tmp_path):
    batching = {"max_queue_delay_ms": 5, "default_timeout_ms": 100, "policy": "slo", "slo_ms": 50}
    db = load_model_config(write_model(tmp_path, changed(dynamic_batching=batching))).dynamic_batching
    assert (db.max_queue_delay_ms, db.default_timeout_ms, db.slo_ms) == (5.0, 100.0, 50.0)
    assert all(type(v) is float for v in (db.max_queue_delay_ms, db.default_timeout_ms, db.slo_ms))
    times = {"grace_period_s": 10, "max_connection_age_s": 60, "max_connection_age_grace_s": 0, "switch_interval_ms": 1}
    s = server_settings(**times)
    assert {f: getattr(s, f) for f in times} == times
    assert all(type(getattr(s, f)) is float for f in times)


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("grace_period_s", "30", "a number"),
        ("grace_period_s", True, "a number"),
        ("max_connection_age_s", "60", "a number"),
        ("switch_interval_ms", "1.5", "a number"),
        ("metrics", "false", "a boolean"),
        ("metrics", 0, "a boolean"),
        ("admin", "true", "a boolean"),
        ("admin", "yes", "a boolean"),
        ("admin", 1, "a boolean"),
        ("server_timing", "1", "a boolean"),
        ("drain_wakeups", 1.0, "a boolean"),
    ],
)
def test_server_settings_times_and_switches_are_not_coerced(field, value, kind):
    with pytest.raises(ConfigError) as info:
        server_settings(**{field: value})
    assert str(info.value) == f"server settings: {field}: expected {kind}; got {value!r}"


@pytest.mark.parametrize(
    ("profile", "why"),
    [
        (None, "cannot read profile {p}: [Errno 2] No such file or directory: '{p}'"),
        ({"schema": "wok.profile/1"}, "profile {p}: no numeric fit.alpha_s and fit.beta_s (KeyError('fit'))"),
        (
            {"schema": "wok.profile/1", "fit": {"alpha_s": "0.001", "beta_s": 1e-5}},
            "profile {p}: fit.alpha_s and fit.beta_s: expected numbers; got '0.001' and 1e-05",
        ),
        (  # in the file's words: it was "got True and None", Python's
            {"schema": "wok.profile/1", "fit": {"alpha_s": True, "beta_s": None}},
            "profile {p}: fit.alpha_s and fit.beta_s: expected numbers; got true and null",
        ),
    ],
)
def test_a_bad_slo_profile_is_named_by_its_field(tmp_path, profile, why):
    """It was named as `dynamic_batching: Value error, …`, the field left to guess."""
    if profile is not None:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "p.json").write_text(json.dumps(profile))
    batching = {"policy": "slo", "slo_ms": 50, "slo_profile": "p.json"}
    msg, path = load_error(tmp_path, changed(dynamic_batching=batching))
    p = tmp_path / "m" / "p.json"
    assert msg == f"{path}: dynamic_batching.slo_profile: {why.format(p=p)}"


@pytest.mark.parametrize("value", [1e300, 600_000.5])
def test_default_timeout_ms_is_bounded_as_slo_ms(tmp_path, value):
    # Unbounded, inf would load and then fail every ModelConfig call, which reports it in whole µs.
    msg, path = load_error(tmp_path, changed(dynamic_batching={"default_timeout_ms": value}))
    assert msg == (f"{path}: dynamic_batching.default_timeout_ms: expected <= 600000; got {value}")


@pytest.mark.parametrize(
    ("value", "shown"), [(float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")]
)
@pytest.mark.parametrize("field", ["max_queue_delay_ms", "default_timeout_ms", "slo_ms", "slo_quantile"])
@pytest.mark.parametrize("filename", ["config.toml", "config.yaml"])
def test_a_time_or_quantile_that_is_no_finite_number_is_named_so(tmp_path, field, value, shown, filename):
    # nan was refused as "Input should be less than or equal to 60000 (got nan)", as though a smaller nan
    # would do; TOML writes nan and inf, YAML .nan and .inf: shown in JSON's words, as any value of a file is
    # (Python's json writes and reads NaN and Infinity), at the top level as within a list.
    batching = {"policy": "slo", "slo_ms": 50.0} if field.startswith("slo") else {}
    msg, path = load_error(tmp_path, changed(dynamic_batching={**batching, field: value}), filename=filename)
    assert msg == f"{path}: dynamic_batching.{field}: expected a finite number; got {shown}"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize(
    "field", ["grace_period_s", "max_connection_age_s", "max_connection_age_grace_s", "switch_interval_ms"]
)
def test_server_settings_times_that_are_no_finite_number_are_named_so(field, value):
    extra = {"max_connection_age_s": 60.0} if field == "max_connection_age_grace_s" else {}
    with pytest.raises(ConfigError) as info:
        server_settings(**{field: value}, **extra)
    assert str(info.value) == f"server settings: {field}: expected a finite number; got {value}"


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (
            {"dynamic_batching": 5},
            "dynamic_batching: expected a table of settings (or an instance of DynamicBatchingConfig); got 5",
        ),
        ({"inputs": {"name": "INPUT0"}}, "inputs: expected a list; got a table"),
        ({"instances": {"devices": "cpu"}}, "instances.devices: expected a list; got 'cpu'"),
        ({"parameters": 5}, "parameters: expected a table; got 5"),
        ({"factory": 5}, "factory: expected a string; got 5"),
        (
            {"dynamic_batching": {"policy": "slo", "slo_ms": 50, "slo_profile": 5}},
            "dynamic_batching.slo_profile: expected a path; got 5",
        ),
        (
            {"dynamic_batching": {"policy": "slo", "slo_ms": 50, "slo_quantile": 1.0}},
            "dynamic_batching.slo_quantile: expected < 1; got 1.0",
        ),
        (
            {"dynamic_batching": {"policy": "slo", "slo_ms": 50, "slo_quantile": 0.25}},
            "dynamic_batching.slo_quantile: expected >= 0.5; got 0.25",
        ),
        ({"platform": "onnx"}, "platform: expected 'torchscript', 'torch_export' or 'python'; got 'onnx'"),
    ],
    ids=["table", "list-table", "list-text", "parameters", "string", "path", "below", "at-least", "choice"],
)
def test_pydantics_refusals_name_the_setting_what_it_expects_and_what_it_got(tmp_path, change, refusal):
    """They read "<setting>: Input should be ... (got V)", or "Input should be a valid dictionary or instance
    of ..." with no value at all."""
    msg, path = load_error(tmp_path, changed(**change))
    assert msg == f"{path}: {refusal}"


def test_a_server_setting_off_its_pattern_names_the_pattern():
    with pytest.raises(ConfigError) as info:
        server_settings({"auth_token_env": "--auth-token-env"}, auth_token_env="1TOKENS")
    assert str(info.value) == "--auth-token-env: expected a string matching '^[A-Za-z_][A-Za-z0-9_]*$'; got '1TOKENS'"


def test_an_error_type_the_settings_do_not_map_is_said_in_pydantics_words():
    """A type _EXPECTED lacks (no wok setting raises one today) still reads "<setting>: expected ...; got V":
    pydantic's requirement after "expected", or its whole message where it does not say "Input should be"."""
    from pydantic import AfterValidator, BaseModel, Field, ValidationError

    def _odd(v: int) -> int:
        if v % 2 == 0:
            raise AssertionError("an odd number")  # not `assert`: pytest rewrites its message in this module
        return v

    class Knobs(BaseModel):
        step: int = Field(multiple_of=4)
        odd: typing.Annotated[int, AfterValidator(_odd)] = 1

    with pytest.raises(ValidationError) as info:
        Knobs(step=6, odd=2)
    assert _describe(info.value, Knobs) == (
        "step: expected a multiple of 4; got 6; odd: expected a valid value (Assertion failed, an odd number); got 2"
    )


def test_preferred_batch_sizes_are_sorted_as_triton_keeps_them(tmp_path):
    # The batcher flushes at the largest size reached, whatever the order; Triton keeps them as a set.
    cfg = load_model_config(write_model(tmp_path, changed(dynamic_batching={"preferred_batch_sizes": [8, 2, 4]})))
    assert cfg.dynamic_batching.preferred_batch_sizes == (2, 4, 8)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([4, 4], "4 is given more than once in [4, 4]; expected each size once"),
        ([8, 2, 8, 2, 4], "2, 8 are given more than once in [8, 2, 8, 2, 4]; expected each size once"),
    ],
)
def test_a_preferred_batch_size_given_twice_is_refused(tmp_path, sizes, message):
    # [4, 4] loaded, likely a slip for another size; the ModelConfig RPC then reported both.
    msg, path = load_error(tmp_path, changed(dynamic_batching={"preferred_batch_sizes": sizes}))
    assert msg == f"{path}: dynamic_batching.preferred_batch_sizes: {message}"


@pytest.mark.parametrize(
    ("name", "char"), [("in\nx", "000A"), ("in\x00", "0000"), ("a\tb", "0009"), ("x\u2028", "2028")]
)
@pytest.mark.parametrize("kind", ["inputs", "outputs"])
def test_a_tensor_name_with_a_control_character_is_refused(tmp_path, kind, name, char):
    # "in\nx" loaded and served: an error naming it ("input 'in\nx': expected shape ...") came in two lines.
    data = changed(**{kind: [{"name": name, "datatype": "FP32", "dims": [4]}]})
    msg, path = load_error(tmp_path, data, filename="config.yaml")  # the helper's TOML does not escape them
    assert msg == (
        f"{path}: {kind}.0.name: tensor name {quoted_name(name)} holds a control character (U+{char}): it would "
        "break the one-line errors and log lines that name the tensor, and a NUL cannot be sent by clients that "
        "pass names as C strings (Triton's C API); expected printable characters"
    )
    # The rest is taken: Triton checks only that a name is not empty, and gRPC and JSON carry any UTF-8
    # string. An input and an output of one name are two tensors there too (a request names them apart).
    tensors = [{"name": n, "datatype": "FP32", "dims": [4]} for n in ("IN PUT", "入力", 'a"b,c:d')]
    data = changed(inputs=tensors, outputs=[{"name": "IN PUT", "datatype": "FP32", "dims": [3]}])
    cfg = load_model_config(write_model(tmp_path / "ok", data))
    assert [t.name for t in cfg.inputs] == ["IN PUT", "入力", 'a"b,c:d'] and cfg.outputs[0].name == "IN PUT"


@pytest.mark.parametrize("name", [" INPUT0", "INPUT0 ", "\u00a0INPUT0"])
def test_a_tensor_name_beginning_or_ending_with_a_space_is_refused(tmp_path, name):
    msg, path = load_error(tmp_path, changed(inputs=[{"name": name, "datatype": "FP32", "dims": [4]}]))
    assert msg == (
        f"{path}: inputs.0.name: tensor name {quoted_name(name)} begins or ends with a space: clients would have "
        "to send it, spaces and all, and every message shows it as 'INPUT0' would look; expected no space at either "
        "end"
    )


@pytest.mark.parametrize("field", ["model_file", "weights"])
def test_an_empty_file_name_is_refused_not_skipped(tmp_path, field):
    # weights = "" loaded the model without weights, not a word said; model_file = "" read "needs model_file".
    data = changed(platform="torchscript", model_file="m.pt", parameters={}) if field == "model_file" else changed()
    if field == "model_file":
        del data["factory"]
    data[field] = ""
    msg, path = load_error(tmp_path, data)
    assert msg == f"{path}: {field}: expected at least 1 character; got ''"


def test_default_timeout_ms_takes_its_bound(tmp_path):
    cfg = load_model_config(write_model(tmp_path, changed(dynamic_batching={"default_timeout_ms": 600_000})))
    assert cfg.dynamic_batching.default_timeout_ms == 600_000.0


def test_max_queue_size_fits_the_model_config_rpcs_uint32(tmp_path):
    # 2**32 loaded, and then every ModelConfig call failed: UNKNOWN, "Value out of range", with a
    # traceback in the server's log.
    assert load_model_config(write_model(tmp_path, changed(dynamic_batching={"max_queue_size": 2**32 - 1})))
    msg, path = load_error(tmp_path / "b", changed(dynamic_batching={"max_queue_size": 2**32}))
    assert msg == (f"{path}: dynamic_batching.max_queue_size: expected <= 4294967295; got 4294967296")


# Text a config gives (a name, a value, a key, a path) is shown as a request's names are, by wok.errors'
# `quoted_name`: in single quotes whatever it holds, as it is when printable, cut past NAME_CHARS to its
# start and its length. It was its repr: "it's" in double quotes, a backslash doubled, and a 150,000-
# character name written out whole, in a message that then named a tensor twice (300 KB).
LONG_NAME = "a b" * 50_000
SPACED = "X" * 1000 + " "


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        ({"name": "it's"}, "name", "expected a model name of letters, digits, '_', '.' and '-' only; got 'it's'"),
        (
            {"name": LONG_NAME},
            "name",
            "expected a model name of letters, digits, '_', '.' and '-' only; got "
            f"'{LONG_NAME[:200]}'… (150,000 characters in all)",
        ),
        (
            {"inputs": [{"name": SPACED, "datatype": "FP32", "dims": [4]}]},
            "inputs.0.name",
            f"tensor name '{'X' * 200}'… (1,001 characters in all) begins or ends with a space: clients would have to "
            f"send it, spaces and all, and every message shows it as '{'X' * 200}'… (1,000 characters in all) would "
            "look; expected no space at either end",
        ),
        (
            {"inputs": [{"name": "INPUT0", "datatype": "FP\\32", "dims": [4]}]},
            "inputs.0.datatype",
            "expected a V2 datatype, one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, "
            "FP32, FP64, BYTES, BF16; got 'FP\\32'",
        ),
        (
            {"instances": {"devices": ["it's"]}},
            "instances.devices",
            f"expected {DEVICE_FORMS}; got 'it's'",
        ),
        (
            {"max_batch_size": "9" * 1000},
            "max_batch_size",
            f"expected an integer; got '{'9' * 200}'… (1,000 characters in all)",
        ),
        # A list's repr, whole: a config's list of 20,000 numbers made a refusal of 129 KB. Cut to
        # NAME_CHARS bytes, its note (34 bytes as JSON writes it, 33 for 60,000) included.
        (
            {"max_batch_size": list(range(20_000))},
            "max_batch_size",
            f"expected an integer; got {str(list(range(20_000)))[:166]}… (128,890 characters in all)",
        ),
        (
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [0] * 20_000}]},
            "inputs.0.dims",
            f"expected each dim -1 (variable) or >= 1; got {str([0] * 20_000)[:167]}… (60,000 characters in all)",
        ),
    ],
    ids=["quote", "long-name", "long-tensor-name", "backslash", "device", "long-value", "long-list", "long-dims"],
)
def test_text_from_a_config_is_shown_quoted_cut_and_escaped(tmp_path, change, where, message):
    msg, path = load_error(tmp_path, changed(**change))
    assert msg == f"{path}: {where}: {message}"


def test_a_yaml_null_is_shown_in_the_file_s_word(tmp_path):
    # It was "got None", Python's word for what the file wrote as null (TOML has none).
    msg, path = load_error(tmp_path, changed(max_batch_size=None), "config.yaml")
    assert msg == f"{path}: max_batch_size: expected an integer; got null"


def test_yaml_booleans_and_nulls_are_shown_in_the_file_s_words_nested_too(tmp_path):
    # They were "[True, None, 'x']", Python's words; a list within itself (a YAML alias) is shown as repr shows
    # it, not without end.
    msg, path = load_error(tmp_path, changed(colour=[True, None, "x", {"on": False}]), "config.yaml")
    assert (
        msg
        == f'{path}: colour: expected a known setting; got an unknown one, set to [true, null, "x", {{"on": false}}]'
    )
    d = write_model(tmp_path, BASE, filename="config.yaml")
    (d / "config.yaml").write_text((d / "config.yaml").read_text() + "colour: &loop [true, *loop]\n")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value).endswith("colour: expected a known setting; got an unknown one, set to [true, [...]]")


@pytest.mark.parametrize("filename", ["config.toml", "config.yaml"])
def test_a_nan_or_infinity_within_a_list_is_shown_in_json_s_words(tmp_path, filename):
    # They were nan, inf and -inf within a JSON-worded list, words no JSON reader takes; NaN and Infinity as the top
    # level shows them (Python's json writes and reads them).
    msg, path = load_error(tmp_path, changed(colour=[1.5, math.nan, {"x": math.inf, "y": -math.inf}]), filename)
    assert msg == (
        f'{path}: colour: expected a known setting; got an unknown one, set to [1.5, NaN, {{"x": Infinity, '
        '"y": -Infinity}]'
    )


@pytest.mark.parametrize("index", ["\N{SUPERSCRIPT TWO}", "\N{ARABIC-INDIC DIGIT THREE}"])
def test_a_cuda_index_of_other_digits_is_refused(tmp_path, index):
    """isdigit() takes "²" (int() refuses it) and "٣" (int() reads 3): "cuda:²" passed the config's check."""
    msg, path = load_error(tmp_path, changed(instances={"devices": [f"cuda:{index}"]}))
    assert msg == f"{path}: instances.devices: expected {DEVICE_FORMS}; got 'cuda:{index}'"


# torch.device() refuses the first two, and reads an index in 8 signed bits: "cuda:128" was cuda:-128, which
# passed executor.resolve_devices' count check as every negative index does, "cuda:255" plain cuda.
TORCH_MISREADS = ["cuda:", "cuda:01", "cuda:128", "cuda:255", "cuda:" + "1" * 5000]


@pytest.mark.parametrize("device", TORCH_MISREADS, ids=["empty", "leading-zero", "128", "255", "5000-digits"])
def test_a_device_torch_refuses_or_misreads_is_refused(tmp_path, device):
    """The config took "cuda:" (an empty index) and any digits, where `wok demo` and `wok profile` refused
    the first: one rule now (config.check_device), for all three."""
    msg, path = load_error(tmp_path, changed(instances={"devices": ["cpu", device]}))
    assert msg == f"{path}: instances.devices: expected {DEVICE_FORMS}; got {quoted_name(device)}"
    try:
        read = str(torch.device(device))
    except RuntimeError:
        read = None
    assert read != device


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:7", "cuda:10", "cuda:127"])
def test_a_device_the_config_takes_is_read_by_torch_as_written(device):
    assert check_device(device) == device
    assert str(torch.device(device)) == device


def test_a_negative_zero_is_taken_as_zero(tmp_path):
    """-0.0 passes ge=0 as -0 (an int: 0) does, and was kept: GET /admin/batching answered a window of -0.0."""
    d = write_model(tmp_path, changed(dynamic_batching={"max_queue_delay_ms": -0.0, "default_timeout_ms": -0.0}))
    assert "max_queue_delay_ms = -0.0" in (d / "config.toml").read_text()
    batching = load_model_config(d).dynamic_batching
    settings = server_settings(grace_period_s=-0.0, max_connection_age_s=60.0, max_connection_age_grace_s=-0.0)
    values = [batching.max_queue_delay_ms, batching.default_timeout_ms]
    values += [settings.grace_period_s, settings.max_connection_age_grace_s]
    assert [math.copysign(1, v) for v in values] == [1.0] * 4


def test_a_folder_key_or_path_from_a_config_is_shown_quoted_as_names_are(tmp_path):
    d = write_model(tmp_path, BASE, name="it's")
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value).startswith(f"{d / 'config.toml'}: name: expected a model name of ")
    assert str(info.value).endswith("; got 'it's'")
    d = tmp_path / "m"
    d.mkdir()
    text = yaml.safe_dump(BASE)
    first = len(text.splitlines()) + 1
    (d / "config.yaml").write_text(text + '"it\'s": 1\n"it\'s": 2\n')
    with pytest.raises(ConfigError) as info:
        load_model_config(d)
    assert str(info.value) == (
        f"{d / 'config.yaml'}: not valid YAML: 'it's' is given twice, on lines {first} and {first + 1}"
    )
    profile = "../it's.json"
    msg, path = load_error(
        tmp_path / "p", changed(dynamic_batching={"policy": "slo", "slo_ms": 50.0, "slo_profile": profile})
    )
    assert msg == (
        f"{path}: dynamic_batching.slo_profile '{profile}' leaves the model's folder {path.parent}; expected a path "
        "inside it"
    )


def test_a_path_given_where_another_value_was_expected_is_shown_as_its_text():
    """Its repr was shown: PosixPath('x'), not the text the user gave."""
    with pytest.raises(ConfigError) as info:
        server_settings({"grpc_port": "--port"}, grpc_port=Path("it's"))
    assert str(info.value) == "--port: expected an integer; got 'it's'"


def test_a_long_host_is_shown_cut():
    with pytest.raises(ConfigError) as info:
        server_settings(host=" " * 1000)
    assert str(info.value) == (
        f"server settings: host: expected an address or a host name; got '{' ' * 200}'… (1,000 characters in all)"
    )
