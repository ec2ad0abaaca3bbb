"""`wok profile`'s request pool held under a cap, and a Ctrl-C while the model runs a batch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest
import torch

from wok.__main__ import main
from wok.bench import profiler
from wok.bench.payloads import POOL_CAP_BYTES
from wok.bench.profiler import ProfileConfig
from wok.config import model_config_from_dict
from wok.servable import Servable

from ..conftest import write_python_model

CPU = torch.device("cpu")


def _config(name: str, dims: list[int], factory: str) -> object:
    return model_config_from_dict(
        {
            "name": name,
            "platform": "python",
            "factory": f"{__name__}:{factory}",
            "inputs": [{"name": "x", "datatype": "FP32", "dims": dims}],
            "outputs": [{"name": "y", "datatype": "FP32", "dims": dims}],
            "max_batch_size": 4,
        },
        source="test",
    )


class Lengths(Servable):
    """Sequences of L floats, returned as they are; batched by their shape (the default key)."""

    def __init__(self) -> None:
        super().__init__(_config("lengths", [-1], "Lengths"), torch.nn.Identity())


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_capped_pool_holds_the_same_draws_and_its_batches_take_them_in_turn():
    """One key (sequences of 100 floats, 400 bytes each): under a cap of 10 of them the pool holds the first 10 of
    the 256 it draws, the same requests as an uncapped pool's, and counts all 256 to the key. A batch takes its
    random place among the 256 as the uncapped pool's does (the same draw of the same generator), and the held
    requests from there in turn: those of the uncapped batch, each index modulo 10."""
    model = Lengths()
    cfg = ProfileConfig(batch_sizes=[1, 4], sizes="fixed:100")
    whole = profiler.keyed_pool(model, cfg, 256, 4)
    capped = profiler.keyed_pool(model, cfg, 256, 4, cap_bytes=10 * 400)
    assert (len(whole.requests), whole.held_bytes) == (256, 256 * 400)
    assert (len(capped.requests), capped.held_bytes, capped.size) == (10, 10 * 400, 256)
    assert capped.counts == whole.counts == {((100,),): 256} and capped.keys == whole.keys
    assert all(_same(a, b) for a, b in zip(capped.requests, whole.requests[:10]))
    assert (capped.most, capped.short(4), capped.allowed(4)) == (whole.most, whole.short(4), whole.allowed(4))
    for seed in range(20):
        batch = whole.batch(np.random.default_rng(seed), 4)
        assert capped.batch(np.random.default_rng(seed), 4) == [i % 10 for i in batch]


def test_a_pool_keeps_one_request_of_each_key_past_its_cap():
    """Sequences of 1 to 40 floats, a key per length: with a cap of nothing each key holds its first request alone,
    counted for all it drew (the extra draws' too, the same as uncapped), and a batch of 4 repeats it."""
    model = Lengths()
    cfg = ProfileConfig(batch_sizes=[1, 4], sizes="uniform:1:40")
    whole = profiler.keyed_pool(model, cfg, 256, 4)
    capped = profiler.keyed_pool(model, cfg, 256, 4, cap_bytes=0)
    assert capped.counts == whole.counts and capped.extra_draws == whole.extra_draws
    assert all(len(members) == 1 for members in capped.groups.values())
    assert [capped.requests[members[0]]["x"].shape for members in capped.groups.values()] == [
        whole.requests[members[0]]["x"].shape for members in whole.groups.values()
    ]
    assert capped.held_bytes == sum(profiler.request_bytes(r) for r in capped.requests)
    batch = capped.batch(np.random.default_rng(0), 4)
    assert len(batch) == 4 and len(set(batch)) == 1


class OneBucket(Lengths):
    """Sequences of any length in one batching key, as encoder's length bucket holds several lengths."""

    def batch_key(self, inputs):
        return "all"


def test_a_capped_pool_holds_the_draws_up_to_the_first_past_its_cap():
    """One key of sequences of 1 to 2,000 floats: the pool holds its draws up to the first that would pass the cap, as
    the bench's pool keeps its draws (`plan_pool`), and none after. A smaller request after it was held where larger
    ones were not (while it fitted), drawing the key's held requests towards its shortest: here 28 held of mean length
    893 floats, where the draws' is 1,043 (the 22 held now: 1,076), and the batches' times with them."""
    model = OneBucket()
    cfg = ProfileConfig(batch_sizes=[1, 4], sizes="uniform:1:2000")
    whole = profiler.keyed_pool(model, cfg, 256, 4)
    cap = 100_000
    capped = profiler.keyed_pool(model, cfg, 256, 4, cap_bytes=cap)
    held = len(capped.requests)
    assert all(_same(a, b) for a, b in zip(capped.requests, whole.requests[:held]))
    sizes = [profiler.request_bytes(r) for r in whole.requests]
    assert sum(sizes[:held]) <= cap < sum(sizes[: held + 1])
    assert capped.held_bytes == sum(sizes[:held]) and capped.counts == whole.counts == {"all": 256}


def test_the_pool_holds_no_more_than_its_cap_in_memory():
    """Requests of 400,000 bytes (10^5 FP32 values): 256 of them are 102 MB, which the pool held whole (past the
    machine's memory, with overcommit, the OOM killer's to find). Made one at a time and capped at POOL_CAP_BYTES
    (64 MiB, the bench's cap), the most numpy's arrays hold at once as the pool is drawn (tracemalloc's peak: numpy
    reports its data to it) is the requests held and the one being made past them."""
    model = Lengths()
    cfg = ProfileConfig(batch_sizes=[1, 4], sizes="fixed:100000")
    tracemalloc.start()
    try:
        pool = profiler.keyed_pool(model, cfg, 256, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = POOL_CAP_BYTES // 400_000
    assert (len(pool.requests), pool.held_bytes, pool.size) == (held, held * 400_000, 256)
    # The held requests and the one being made: a request dropped was held (by the loop and the draws' generator)
    # while the next was made, 400,000 bytes more, until 2026-12-06.
    assert peak < pool.held_bytes + 1.6 * 400_000, f"{peak:,} bytes at the peak"


IDENTITY_MODEL = """
from torch import nn


def build(**parameters):
    return nn.Identity()
"""


def test_the_profile_says_what_its_capped_pool_held(tmp_path, capsys):
    """The document's `config.pool` and the line under the table: 167 requests of 400,000 bytes held (66.8 MB, under
    64 MiB) of the 256 drawn; a pool that held every request has no line."""
    folder = write_python_model(tmp_path / "repo" / "wide", IDENTITY_MODEL, 4, dims="-1")
    fast = ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "2", "--peak-flops", "1T", "--bandwidth", "1T"]
    argv = ["profile", "wide", "--model-repository", str(folder.parent), *fast, "--json", str(tmp_path / "p.json")]
    assert main([*argv, "--sizes", "fixed:100000"]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["config"]["pool"] == {
        "requests": 256,
        "held": 167,
        "held_bytes": 167 * 400_000,
        "cap_bytes": POOL_CAP_BYTES,
    }
    said = (
        "request pool capped at 64 MiB: 167 requests held (63.7 MiB) of its 256; a batch takes its key's held "
        "requests in turn, so their values repeat"
    )
    assert said in out.splitlines(), out
    assert main([*argv, "--sizes", "fixed:4"]) == 0
    out = capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["config"]["pool"]["held"] == 256
    assert "request pool" not in out, out


def test_the_profile_says_which_batches_repeated_a_request(tmp_path, capsys, monkeypatch):
    """A pool capped at 10,000 bytes holds 2 requests of 4,000: a batch of 4 takes them in turn, each twice, and a
    repeat is assembled from cache (KeyedPool.batch: 0.51x to 0.88x the assemble time of distinct ones), which the
    document and the table did not say. Batches of 1 and 2 hold distinct requests: nothing said of them."""
    monkeypatch.setattr(profiler, "POOL_CAP_BYTES", 10_000)
    folder = write_python_model(tmp_path / "repo" / "wide", IDENTITY_MODEL, 4, dims="-1")
    fast = ["--batch-sizes", "1,2,4", "--warmup", "1", "--repeats", "3", "--peak-flops", "1T", "--bandwidth", "1T"]
    argv = ["profile", "wide", "--model-repository", str(folder.parent), *fast, "--json", str(tmp_path / "p.json")]
    assert main([*argv, "--sizes", "fixed:1000"]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["config"]["pool"]["held"] == 2
    assert [b.get("requests_repeated") for b in doc["batches"]] == [None, None, {"batches": 3, "share": 1.0}]
    said = (
        "batches that held a request more than once, their key holding fewer than n under the pool's cap: "
        "n = 4: 100% of them; a repeat is assembled from cache, so their assemble and batch times may read low"
    )
    assert said in out.splitlines(), out


class Stuck(Servable):
    """Four floats returned as they are; once `armed`, a forward sets `started` and waits for `release`."""

    def __init__(self) -> None:
        super().__init__(_config("stuck", [4], "Stuck"), torch.nn.Identity())
        self.armed, self.started, self.release = threading.Event(), threading.Event(), threading.Event()

    def forward(self, module, tensors):
        if self.armed.is_set():
            self.started.set()
            self.release.wait()
        return self.name_outputs(module(tensors["x"]))


def test_a_ctrl_c_leaves_a_batch_the_model_is_still_running_after_a_bounded_wait():
    """A KeyboardInterrupt in the profile (its timed batches here) while the model runs a batch: the executor's
    shutdown waited for that batch (`shutdown(wait=True)`), a stuck model's for good. It waits `wait_s` now and
    raises ModelStillRunning, a KeyboardInterrupt, the model still in its batch (released only after)."""
    model = Stuck()
    cfg = ProfileConfig(batch_sizes=[1, 2])
    try:
        with pytest.raises(profiler.ModelStillRunning) as info:
            with profiler.warmed_executor(model, CPU, cfg, wait_s=0.2) as executor:
                model.armed.set()
                executor.instances[0].submit([{"x": np.zeros((1, 4), np.float32)}], [1], 0)
                assert model.started.wait(30)
                raise KeyboardInterrupt
        assert not model.release.is_set()
    finally:
        model.release.set()
    assert str(info.value) == "model 'stuck' was still running a batch 0.2 s after it; not waited for"
    assert isinstance(info.value, KeyboardInterrupt) and type(info.value.__cause__) is KeyboardInterrupt


def test_a_ctrl_c_with_no_batch_running_stays_a_ctrl_c():
    model = Stuck()
    with pytest.raises(KeyboardInterrupt) as info:
        with profiler.warmed_executor(model, CPU, ProfileConfig(batch_sizes=[1, 2]), wait_s=30):
            raise KeyboardInterrupt
    assert type(info.value) is KeyboardInterrupt


def test_a_second_ctrl_c_in_the_wait_for_a_running_batch_leaves_it_at_once():
    """A second Ctrl-C while the shutdown waits for the model's batch (a user's second press): it was raised as it
    came, a bare KeyboardInterrupt, and `wok profile` said "interrupted" and hung in Python's exit, joining the
    stuck model's thread. It is the first's ModelStillRunning now, at once (`wait_s` is 30 s here). Gated on the
    shutdown's start (an event), the second SIGINT sent to the main thread, where Python raises it."""
    assert threading.current_thread() is threading.main_thread()  # the SIGINT's KeyboardInterrupt lands here
    model = Stuck()
    cfg = ProfileConfig(batch_sizes=[1, 2])
    shutting = threading.Event()

    def second_press() -> None:
        if shutting.wait(30):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    presser = threading.Thread(target=second_press)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            with profiler.warmed_executor(model, CPU, cfg, wait_s=30) as executor:
                shutdown = executor.shutdown

                def shut_down() -> None:
                    shutting.set()
                    shutdown()

                executor.shutdown = shut_down
                model.armed.set()
                executor.instances[0].submit([{"x": np.zeros((1, 4), np.float32)}], [1], 0)
                assert model.started.wait(30)
                presser.start()
                raise KeyboardInterrupt
        assert not model.release.is_set()
    finally:
        model.release.set()
        shutting.set()
        if presser.ident is not None:
            presser.join()
    assert type(info.value) is profiler.ModelStillRunning, repr(info.value)
    assert str(info.value) == "model 'stuck' was still running a batch at a second Ctrl-C; not waited for"


STUCK_MODEL = """
import sys
import threading

from torch import nn


class Stuck(nn.Module):
    def forward(self, x):
        print("test: the forward started", file=sys.stderr, flush=True)
        threading.Event().wait()
        return x


def build(**parameters):
    return Stuck()
"""


def test_a_ctrl_c_in_the_warm_up_of_a_stuck_model_ends_wok_profile(tmp_path):
    """SIGINT to `wok profile` while the model's warm-up forward never ends: the process waited for that forward
    (the executor's `shutdown(wait=True)`, then Python's exit joining its thread), for good. It says so in one line
    and exits 130 about 1 s after the signal. Gated on the model's own line on stderr, not a sleep."""
    folder = write_python_model(tmp_path / "repo" / "stuck", STUCK_MODEL, 4)
    cmd = [sys.executable, "-m", "wok", "profile", "stuck", "--model-repository", str(folder.parent)]
    proc = subprocess.Popen(
        [*cmd, "--batch-sizes", "1,2", "--peak-flops", "1T", "--bandwidth", "1T"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        before = []
        for line in proc.stderr:
            if line == "test: the forward started\n":
                break
            before.append(line)
        else:
            pytest.fail(f"wok profile ended before the forward started: {''.join(before)[-2000:]}")
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("wok profile was still running 60 s after SIGINT")
    finally:
        proc.kill()
        proc.communicate()
    assert (proc.returncode, out) == (130, "")
    assert err == (
        "wok profile: interrupted; model 'stuck' was still running a batch 1 s after it; not waited for; exiting\n"
    )
