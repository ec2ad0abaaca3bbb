"""A model whose execution the test controls: it waits on a gate and records each batch."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time

import grpc
import pytest
import torch
import uvloop
from torch import nn

from wok.config import model_config_from_dict
from wok.executor import Executor
from wok.health import ENDED
from wok.servable import Servable


class GatedDouble(nn.Module):
    """Returns 2x; blocks while the gate is closed; raises on a batch holding a NaN.

    `entered` is set by every batch, or with `enter_when_closed` only by one that finds the gate
    closed (so that a served model's warm-up, run with the gate open, does not set it).
    """

    def __init__(self, enter_when_closed: bool = False) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.enter_when_closed = enter_when_closed
        self.batch_sizes: list[int] = []
        # (entered, returning) per batch that returned, time.perf_counter(): within its worker's (started, finished).
        self.ran: list[tuple[float, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entered = time.perf_counter()
        self.batch_sizes.append(int(x.shape[0]))
        if not self.enter_when_closed or not self.gate.is_set():
            self.entered.set()
        # A backstop for a test that awaits a batch it never lets through: a failure rather than
        # a hang (the fixtures below open the gate before they shut an executor down). Held
        # batches wait 1.2 s at most in the suite (tests/server/test_stop_stuck.py).
        if not self.gate.wait(timeout=10):
            raise RuntimeError("test gate never opened")
        if torch.isnan(x).any():
            raise ValueError("NaN in batch")
        out = x * 2
        self.ran.append((entered, time.perf_counter()))
        return out


def four_wide_config(name: str, max_batch_size: int = 8, dynamic_batching: dict | None = None):
    """A python model's config, its factory unused: one FP32 input and output of 4, one CPU instance."""
    config = {
        "name": name,
        "platform": "python",
        "factory": "tests:unused",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [4]}],
        "max_batch_size": max_batch_size,
        "instances": {"count": 1, "devices": ["cpu"]},
    }
    if dynamic_batching is not None:
        config["dynamic_batching"] = dynamic_batching
    return model_config_from_dict(config, "test")


def gated_servable(
    max_batch_size=8,
    delay_ms=10_000.0,
    preferred=(),
    max_queue_size=0,
    depth=1,
    dims=(4,),
    count=1,
    name="gated",
    enter_when_closed=False,
    parameters=None,
):
    """(servable, module) of the gated model; `depth` None leaves `instances.pipeline_depth` unset, which the
    executor runs as 2 slots an instance (its default). `parameters`: the config's, which only ModelConfig answers
    show (the factory is not called)."""
    cfg = model_config_from_dict(
        {
            "name": name,
            "platform": "python",
            "factory": "tests:unused",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": list(dims)}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": list(dims)}],
            "max_batch_size": max_batch_size,
            "dynamic_batching": {
                "max_queue_delay_ms": delay_ms,
                "preferred_batch_sizes": list(preferred),
                "max_queue_size": max_queue_size,
            },
            "instances": {"count": count, "devices": ["cpu"], "pipeline_depth": depth},
            "parameters": parameters or {},
        },
        "test",
    )
    module = GatedDouble(enter_when_closed)
    return Servable(cfg, module), module


@pytest.fixture
def gated_model():
    """`gated_model(**kw)`: gated_servable's (servable, module), for a test that builds its own executor
    or serves it (WokServer); its own module each call (one gate per model)."""
    return gated_servable


def open_and_shut_down(made) -> None:
    """Open each module's gate, then shut its executor down: the shutdown waits for the batch
    running, which a test that failed with the gate closed leaves blocked on it."""
    for module, _ in made:
        module.gate.set()
    for _, ex in made:
        ex.shutdown()


@pytest.fixture
def gated():
    """Build (servable, module, executor); executors are shut down at the end, their gates opened."""
    made = []

    def build(**kw):
        s, m = gated_servable(**kw)
        ex = Executor(s, s.config.instances)
        made.append((m, ex))
        return s, m, ex

    yield build
    open_and_shut_down(made)


class Said(logging.Handler):
    """Sets `said` once `count` records hold `text` (a test waits on it, not on a sleep); `seen`: how many have."""

    def __init__(self, text: str, count: int = 1) -> None:
        super().__init__()
        self.text, self.count, self.seen, self.said = text, count, 0, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen += 1
            if self.seen >= self.count:
                self.said.set()


@contextlib.contextmanager
def saying(name: str, text: str, count: int = 1):
    """A `Said` on logger `name` for the block's length, which logs at INFO at least meanwhile."""
    said = Said(text, count)
    logger = logging.getLogger(name)
    level = logger.level
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    logger.addHandler(said)
    try:
        yield said
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)


async def until(condition, within_s: float = 15.0) -> None:
    """Yield to the loop (1 ms at a time) until `condition()` holds; fail after `within_s` seconds, quoting the
    condition (its source line: "the batcher never got there" was said whatever the test waited for). In seconds,
    as tests/conftest.py's `until` (why there)."""
    end = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= end:
            try:
                said = inspect.getsource(condition).strip()
            except (OSError, TypeError):  # no source (a builtin, or made by exec)
                said = repr(condition)
            raise AssertionError(f"{said}: did not hold within {within_s:g} s")
        await asyncio.sleep(0.001)


async def each_fails_alone(stub, call: str, make, raised: dict[int, BaseException]) -> None:
    """Send a request of each value in `raised`, each followed by one of 0.5, which fails nothing: one call at a time
    (`call` "unary") or all on one stream ("stream", which must end OK), each with a 10 s deadline. Each of `raised`'s
    values is answered INTERNAL, as to_status words the exception it maps to ("internal error: KeyboardInterrupt:
    ki"), and each 0.5 request its answer. `make(value, request_id)`: the request."""
    got: dict[int, tuple[str, str]] = {}
    good: list[tuple[str, str]] = []

    def took(request_id: str, answer: tuple[str, str]) -> None:
        v, value = request_id.split()
        if value == "0.5":
            good.append(answer)
        else:
            got[int(v)] = answer

    reqs = [make(value, f"{v} {value}") for v in raised for value in (v, 0.5)]
    if call == "unary":
        for req in reqs:
            try:
                await stub.ModelInfer(req, timeout=10)
                took(req.id, ("OK", ""))
            except grpc.aio.AioRpcError as exc:
                took(req.id, (exc.code().name, exc.details()))
    else:
        stream = stub.ModelStreamInfer(iter(reqs), timeout=10)
        async for a in stream:
            number = a.infer_response.parameters["status_code"].int64_param if a.error_message else 0
            code = next(c for c in grpc.StatusCode if c.value[0] == number)
            took(a.infer_response.id, (code.name, a.error_message))
        assert await stream.code() == grpc.StatusCode.OK
    assert got == {v: ("INTERNAL", f"internal error: {type(e).__name__}: {e}") for v, e in raised.items()}
    assert good == [("OK", "")] * len(raised)


async def ends_with_the_stop(call, read_s: float = 5.0) -> None:
    """The server's stop ended the open stream `call` (health Watch, reflection) itself: UNAVAILABLE
    "server is shutting down", not gRPC's "Cancelling all calls" after its own stop's grace."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), read_s)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, ENDED)


@pytest.fixture
def gated_instances():
    """Build (module, executor) for the gated model with `count` CPU instances (one module, one gate);
    executors are shut down at the end, their gates opened."""
    made = []

    def build(count: int, max_batch_size: int = 8, depth: int = 1):
        s, module = gated_servable(max_batch_size=max_batch_size, depth=depth, count=count)
        ex = Executor(s, s.config.instances, cpu_linear="torch")
        made.append((module, ex))
        return module, ex

    yield build
    open_and_shut_down(made)


# wok serve runs on uvloop (a dependency) and falls back to asyncio's loop; tests that care
# run on both, each on a fresh loop of its own.
EVENT_LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
def run_on():
    """`run_on("uvloop", coro)`: run the coroutine to its end on a fresh loop of that kind."""

    def run(loop: str, coro):
        # The result is handed out past the main task, which ends holding None: as Runner.run returns, it looks its
        # SIGINT handler up with signal.getsignal, which on Python 3.11 builds (and drops) a message holding the
        # handler's repr, and so the task's and its result's. Answers of a few MiB took 1.5 s to repr per run.
        result = []

        async def main() -> None:
            result.append(await coro)

        with asyncio.Runner(loop_factory=EVENT_LOOPS[loop]) as runner:
            runner.run(main())
        return result[0]

    return run
