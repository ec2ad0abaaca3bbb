"""A model's `check` (config: 'module:callable'): each request's inputs as it is decoded; a ValueError
refuses that request alone with INVALID_ARGUMENT, before it is queued (server/servable.py)."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from wok.codec import decode_response, encode_request
from wok.errors import ConfigError, InvalidInput, ModelExecutionError
from wok.repository import load_servable
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .test_repository import config_toml

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

# Each import of model.py appends a line to imports.log beside it; forward counts the rows it saw.
CHECKED_MODEL = textwrap.dedent(
    """
    import os

    import numpy as np
    import torch
    from torch import nn

    with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
        f.write("imported\\n")

    SEEN = []  # flags.writeable of each checked input


    class Doubles(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rows = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.rows += x.shape[0]
            return torch.cat([x[:, :3] * 2], dim=1)


    def build() -> nn.Module:
        return Doubles()


    def check(inputs):
        x = inputs["INPUT0"]
        SEEN.append(x.flags.writeable)
        if (x < 0).any():
            row = int(np.argwhere(x < 0)[0][0])
            raise ValueError(f"input 'INPUT0': values must be >= 0; got {float(x.min())} in row {row}")
        if (x > 1e6).any():
            raise KeyError("a bug in the check")


    def clips(inputs):
        np.clip(inputs["INPUT0"], 0, None, out=inputs["INPUT0"])


    def says_no(inputs):
        raise ValueError()


    def returns(inputs):
        return bool((inputs["INPUT0"] >= 0).all())


    async def waits(inputs):
        pass


    class AsyncCall:
        async def __call__(self, inputs):
            pass


    waits_too = AsyncCall()


    def swaps(inputs):
        inputs["INPUT0"] = np.zeros((1, 4), np.float32)


    def takes_none():
        pass


    def takes_two(inputs, more):
        pass
    """
)


def checked_model(root: Path, name: str = "chk", check: str = "model:check", source: str = CHECKED_MODEL) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.py").write_text(source)
    extra = f'factory = "model:build"\ncheck = "{check}"'
    (d / "config.toml").write_text(config_toml("python", extra=extra))
    return d


def test_a_check_in_the_factorys_file_is_found_and_the_file_imported_once(tmp_path):
    d = checked_model(tmp_path)
    s = load_servable(d)
    assert (d / "imports.log").read_text() == "imported\n"
    s.check({"INPUT0": np.ones((2, 4), np.float32)})
    with pytest.raises(InvalidInput) as info:
        s.check({"INPUT0": np.array([[1, 1, 1, 1], [0, -2, 0, 0]], np.float32)})
    assert str(info.value) == "model 'chk' refused the request: input 'INPUT0': values must be >= 0; got -2.0 in row 1"


def test_the_check_reads_the_requests_arrays_read_only(tmp_path):
    s = load_servable(checked_model(tmp_path))
    x = np.ones((1, 4), np.float32)  # writable, as an array decoded from typed contents is
    s.check({"INPUT0": x})
    assert s._user_check.__globals__["SEEN"] == [False]


def test_a_check_that_raises_anything_but_value_error_is_its_own_failure_not_the_requests(tmp_path):
    s = load_servable(checked_model(tmp_path))
    with pytest.raises(ModelExecutionError) as info:
        s.check({"INPUT0": np.full((1, 4), 1e7, np.float32)})
    assert str(info.value) == "model 'chk': its check (model:check) failed: KeyError: 'a bug in the check'"


def test_a_check_that_calls_sys_exit_fails_itself_and_not_the_server(tmp_path):
    # SystemExit went through the event loop: one request ended `wok serve`, every client's calls with it.
    source = CHECKED_MODEL + "\n\ndef exits(inputs):\n    import sys\n\n    sys.exit(4)\n"
    s = load_servable(checked_model(tmp_path, check="model:exits", source=source))
    with pytest.raises(ModelExecutionError) as info:
        s.check({"INPUT0": np.ones((1, 4), np.float32)})
    assert str(info.value) == "model 'chk': its check (model:exits) failed: SystemExit: 4"


def test_a_check_that_writes_to_the_request_fails_itself_not_the_request(tmp_path):
    """numpy refuses the write with a ValueError, which is the check's fault, not the client's."""
    s = load_servable(checked_model(tmp_path, check="model:clips"))
    with pytest.raises(ModelExecutionError) as info:
        s.check({"INPUT0": np.full((1, 4), -1.0, np.float32)})
    assert str(info.value) == "model 'chk': its check (model:clips) failed: ValueError: output array is read-only"


def test_a_check_that_swaps_an_input_fails_itself_and_the_request_keeps_its_array(tmp_path):
    s = load_servable(checked_model(tmp_path, check="model:swaps"))
    x = np.full((1, 4), 7.0, np.float32)
    inputs = {"INPUT0": x}
    with pytest.raises(ModelExecutionError) as info:
        s.check(inputs)
    assert str(info.value) == (
        "model 'chk': its check (model:swaps) failed: TypeError: 'mappingproxy' object does not support item assignment"
    )
    assert inputs["INPUT0"] is x


def test_a_failing_check_is_logged_with_its_traceback_once_per_10_s(tmp_path, caplog):
    s = load_servable(checked_model(tmp_path))
    with caplog.at_level(logging.WARNING, logger="wok"):
        for _ in range(3):
            with pytest.raises(ModelExecutionError):
                s.check({"INPUT0": np.full((1, 4), 1e7, np.float32)})
    (record,) = caplog.records
    assert record.getMessage() == "model 'chk': its check (model:check) failed"
    assert isinstance(record.exc_info[1], KeyError)


def test_a_value_error_without_a_message_says_so(tmp_path):
    s = load_servable(checked_model(tmp_path, check="model:says_no"))
    with pytest.raises(InvalidInput) as info:
        s.check({"INPUT0": np.ones((1, 4), np.float32)})
    assert str(info.value) == "model 'chk' refused the request: its check raised ValueError with no message"


def test_a_value_a_check_returns_is_ignored_and_logged_once(tmp_path, caplog):
    s = load_servable(checked_model(tmp_path, check="model:returns"))
    with caplog.at_level(logging.WARNING, logger="wok"):
        for _ in range(3):
            s.check({"INPUT0": np.full((1, 4), -1.0, np.float32)})  # False: not a refusal
    assert [r.getMessage() for r in caplog.records] == [
        "model 'chk': its check (model:returns) returned bool, which is ignored: a check refuses a request by "
        "raising ValueError (logged once)"
    ]


def test_a_model_without_a_check_keeps_the_no_op(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    (d / "model.py").write_text(CHECKED_MODEL)
    (d / "config.toml").write_text(config_toml("python", extra='factory = "model:build"'))
    s = load_servable(d)
    assert s.check.__func__ is type(s).check
    s.check({"INPUT0": np.full((1, 4), -1.0, np.float32)})


def test_a_torchscript_model_takes_a_check_from_its_folder(tmp_path):
    d = tmp_path / "ts"
    d.mkdir()
    torch.jit.script(torch.nn.Linear(4, 3)).save(str(d / "model.pt"))
    (d / "checks.py").write_text(
        "def positive(inputs):\n    if (inputs['INPUT0'] <= 0).any():\n        raise ValueError('no')\n"
    )
    (d / "config.toml").write_text(
        config_toml("torchscript", extra='model_file = "model.pt"\ncheck = "checks:positive"')
    )
    s = load_servable(d)
    with pytest.raises(InvalidInput, match=r"^model 'ts' refused the request: no$"):
        s.check({"INPUT0": np.zeros((1, 4), np.float32)})


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("model.check", "check: expected 'module:callable' with a dotted module name, such as 'model:check'"),
        ("../model:check", "check: expected 'module:callable' with a dotted module name, such as 'model:check'"),
        ("model:nothing", "has no attribute 'nothing'"),
        ("model:SEEN", "'SEEN' in "),
        ("model:waits", "'waits' in "),
        ("model:waits_too", "'waits_too' in "),
        (
            "model:takes_none",
            ": expected a function called with one argument, the request's inputs; got one of signature takes_none()",
        ),
        ("model:takes_two", "; got one of signature takes_two(inputs, more)"),
    ],
)
def test_a_check_that_cannot_be_found_fails_the_load_naming_it(tmp_path, check, message):
    d = checked_model(tmp_path, check=check)
    with pytest.raises(ConfigError) as info:
        load_servable(d)
    assert message in str(info.value), str(info.value)
    if check == "model:SEEN":
        assert str(info.value).endswith("model.py: expected a function; got list")
    if check in ("model:waits", "model:waits_too"):
        assert str(info.value).endswith(
            ": expected a plain function (an async one's call only makes a coroutine, and checks nothing); "
            "got an async function"
        )


async def test_a_request_the_check_refuses_gets_invalid_argument_and_the_others_in_flight_their_answers(
    tmp_path, serve
):
    checked_model(tmp_path / "repo")
    values = [1.0, -1.0, 2.0, 3.0]
    async with serve(repository=tmp_path / "repo") as server:
        module = server.runtime("chk").executor.instances[0].module
        warmed = module.rows
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [stub.ModelInfer(encode_request("chk", {"INPUT0": np.full((1, 4), v, np.float32)})) for v in values]
            results = await asyncio.gather(*calls, return_exceptions=True)
            for v, r in zip(values, results):
                if v < 0:
                    assert isinstance(r, grpc.aio.AioRpcError), r
                    assert r.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert r.details() == (
                        "model 'chk' refused the request: input 'INPUT0': values must be >= 0; got -1.0 in row 0"
                    )
                else:
                    np.testing.assert_array_equal(decode_response(r)["OUTPUT0"], np.full((1, 3), 2 * v, np.float32))
            # A check that fails itself: INTERNAL, naming the check.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("chk", {"INPUT0": np.full((1, 4), 1e7, np.float32)}))
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "model 'chk': its check (model:check) failed: KeyError: 'a bug in the check'"
            st = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="chk"))).model_stats[0]
        assert module.rows - warmed == 3  # the refused requests never reached the model
        assert st.inference_count == 3
        assert server.metrics.models["chk"].rejections["invalid"] == 1
