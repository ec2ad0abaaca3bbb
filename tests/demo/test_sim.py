"""The demo's parts without a browser: the load control, the rolling figures, the simulated mode."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from wok.bench.simulate import BatcherModel, simulate
from wok.config import DEVICE_FORMS
from wok.demo import sim as sim_module
from wok.demo.cli import SimulatedDemo
from wok.demo.load import WINDOW_S, LoadControl, LoadGenerator, Rolling
from wok.demo.sim import SimBackend


def test_rolling_figures_over_the_window_by_hand():
    r = Rolling(span_s=2.0)
    for t in (0.5, 1.0, 1.5, 2.5):
        r.on_send(t)
    r.on_answer(1.0, 0.010, "OK")  # left out at now=3.5: older than 2 s
    r.on_answer(2.0, 0.020, "OK")
    r.on_answer(3.0, 0.040, "OK")
    r.on_answer(3.2, 0.005, "INTERNAL")
    s = r.summary(3.5)
    # In [1.5, 3.5]: sends at 1.5 and 2.5; OK answers of 20 and 40 ms, one error.
    assert s["sent_per_s"] == 1.0 and s["ok_per_s"] == 1.0 and s["errors_per_s"] == 0.5
    assert s["errors"] == {"INTERNAL": 1}
    assert s["p50_ms"] == pytest.approx(30.0) and s["p99_ms"] == pytest.approx(39.8)
    assert (s["sent_total"], s["answered_total"], s["in_flight"]) == (4, 4, 0)
    r.on_skip(1.0)  # left out at 3.5, as the sends: the page's warning ends once none is skipped for 2 s
    r.on_skip(3.0)
    assert (r.summary(3.5)["skipped"], r.summary(3.5)["skipped_total"]) == (1, 2)
    assert (r.summary(5.5)["skipped"], r.summary(5.5)["skipped_total"]) == (0, 2)


async def test_the_callers_cap_holds_when_the_loop_falls_behind():
    release = asyncio.Event()

    async def send() -> str:  # a server that answers nobody until the end
        await release.wait()
        return "OK"

    gen = LoadGenerator(LoadControl(5000), send, max_in_flight=10)
    task = asyncio.ensure_future(gen.run())
    await asyncio.sleep(0)  # run() draws its first window and waits for its first arrival
    time.sleep(2 * WINDOW_S)  # the loop held (by the page, the answers), as under load: the window falls due
    # The arrivals due are made into callers at once, without a yield; then those callers start.
    while len(gen._tasks) < 10 or gen.stats.in_flight < len(gen._tasks):
        await asyncio.sleep(0)
    try:
        assert gen.stats.in_flight == 10
        assert gen.stats.summary(time.monotonic())["skipped"] == gen.stats.skipped_total > 0
    finally:
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_load_control_checks_and_bursts():
    c = LoadControl(100)
    with pytest.raises(ValueError, match=r"field 'rate': expected .* got -1"):
        c.set({"rate": -1})
    with pytest.raises(ValueError, match=r"field 'burst_s': expected .* got null"):
        c.set({"burst_rate": 500})
    with pytest.raises(ValueError, match=r"field 'speed'"):
        c.set({"speed": 2})
    # -0.0 passes `0 <= v` as -0 does, and came back -0.0: taken as 0.
    assert math.copysign(1, c.set({"rate": -0.0})["rate"]) == 1
    state = c.set({"rate": 50, "burst_rate": 800, "burst_s": 5})
    assert state["rate"] == 50 and state["current_rate"] == 800 and 4 < state["burst_left_s"] <= 5
    rng = np.random.default_rng(0)
    start = time.monotonic()
    n = sum(len(c.arrivals(start + k * WINDOW_S, rng)) for k in range(40))  # 2 s at 800/s, in the burst
    assert 1400 < n < 1800
    c.state.burst_until = 0.0
    assert c.describe()["current_rate"] == 50 and c.describe()["burst_rate"] is None


def test_simulated_batches_by_hand():
    # α = β = 1 ms, batches of at most 2, a 10 ms window, one instance; three requests at 0, 1 and 2 ms.
    model = BatcherModel(alpha_s=1e-3, beta_s=1e-3, max_batch_size=2, max_queue_delay_s=0.010)
    sim = SimBackend(LoadControl(0), model)
    sim.start = time.monotonic() - 1.0  # one second of simulated time has passed, with no generated load
    sim.arrivals, sim.answered = [0.0, 0.001, 0.002], np.zeros(3, dtype=bool)
    events, tick = sim.step()
    offset = events[0]["t_start"] - 0.001
    # The first two fill a batch at 1 ms (size) and take 3 ms; the third waits out its window: 12 ms to 14 ms.
    got = [(e["size"], e["reason"], e["t_start"] - offset, e["t_end"] - offset) for e in events]
    # Event times are Unix seconds rounded to the microsecond.
    assert got == [
        (2, "size", pytest.approx(0.001, abs=2e-6), pytest.approx(0.004, abs=2e-6)),
        (1, "delay", pytest.approx(0.012, abs=2e-6), pytest.approx(0.014, abs=2e-6)),
    ]
    assert tick["models"]["simulated"]["queued"] == 0
    assert tick["models"]["simulated"]["flushes"] == {"size": 1, "delay": 1}
    s = sim.stats.summary(time.monotonic())
    assert s["answered_total"] == 3
    assert s["p50_ms"] == pytest.approx(4.0)  # latencies 4, 3 and 12 ms
    assert sim.step()[0] == []  # nothing new: nothing shown twice
    assert sim.set_batching({"max_batch_size": 1})["max_batch_size"] == 1
    with pytest.raises(ValueError, match="field 'max_queue_delay_ms'"):
        sim.set_batching({"max_queue_delay_ms": -1})
    # The window comes back as sent (ms → s → ms once missed 1001 by an ulp), as the server's does.
    for ms in (1001, 1003, 0.1, 2.7, 12.345678):
        assert sim.set_batching({"max_queue_delay_ms": ms})["max_queue_delay_ms"] == ms
    # -0.0 passes `0 <= v` as -0 does, and came back -0.0: taken as 0.
    assert math.copysign(1, sim.set_batching({"max_queue_delay_ms": -0.0})["max_queue_delay_ms"]) == 1


def test_the_simulator_holds_max_queue_delay_ms_to_the_servers_one_bound(monkeypatch):
    """The simulator had 60000 written in, beside the admin API's own constant and the model config's
    `le=60_000`: one changed, the others went on refusing (or taking) by the old bound. Now a model's
    config, the admin API and the simulator read faults.MAX_QUEUE_DELAY_MS, in one check's words."""
    from wok import faults
    from wok.config import DynamicBatchingConfig

    field = DynamicBatchingConfig.model_fields["max_queue_delay_ms"]
    assert [m.le for m in field.metadata if hasattr(m, "le")] == [faults.MAX_QUEUE_DELAY_MS]
    monkeypatch.setattr(faults, "MAX_QUEUE_DELAY_MS", 10, raising=False)
    model = BatcherModel(alpha_s=1e-3, beta_s=1e-3, max_batch_size=2, max_queue_delay_s=0.005)
    sim = SimBackend(LoadControl(0), model)
    with pytest.raises(ValueError, match=r"^field 'max_queue_delay_ms': expected a number from 0 to 10; got 11$"):
        sim.set_batching({"max_queue_delay_ms": 11})
    assert sim.set_batching({"max_queue_delay_ms": 10})["max_queue_delay_ms"] == 10


def test_the_page_s_config_names_the_model_the_simulator_s_ticks_and_answers_name(monkeypatch):
    """The config wrote its own "simulated", a copy of sim.MODEL that a rename of the model would
    have left behind."""
    monkeypatch.setattr(sim_module, "MODEL", "renamed")
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    sim = SimBackend(LoadControl(0), model)
    config = SimulatedDemo(sim, slo_s=0.05).config()
    assert [config["model"], config["batching"]["model"]] == ["renamed", "renamed"]
    assert list(sim.step()[1]["models"]) == ["renamed"]


def _stepped(sim: SimBackend, steps: int) -> tuple[list[dict], float]:
    """`sim` stepped every 50 ms of the test's own clock, `steps` times (so the steps are exact):
    the batch events shown, and the clock at the end."""
    clock = [0.0]
    sim.now = lambda: clock[0]
    shown = []
    for k in range(1, steps + 1):
        clock[0] = 0.05 * k
        shown += sim.step()[0]
    return shown, clock[0]


def _one_run(sim: SimBackend, model: BatcherModel):
    """One run of the simulator over every arrival `sim` made (s since its start), and that run's
    batches as (start, size), in start order. FIFO batches: a batch is a run of consecutive
    arrivals sharing an end time."""
    arrivals = np.asarray(sim.stats.sent) - sim.start
    run = simulate(arrivals, model)
    firsts = np.concatenate(([0], np.nonzero(np.diff(run.done))[0] + 1))
    sizes = np.diff(np.append(firsts, len(arrivals)))
    begins = run.done[firsts] - (model.alpha_s + model.beta_s * sizes)
    return run, [(float(b), int(n)) for b, n in sorted(zip(begins, sizes))]


def test_batch_times_are_shifted_by_one_wall_clock_offset_whatever_the_clock_does_between_steps(monkeypatch):
    # Each step read the wall clock's offset anew (time.time() - time.monotonic()): a preemption
    # between the two reads, 2 ms on a starved CI host, shifted that step's batches alone, and the
    # cut-stepping test below failed by 1.95 ms on 11 of 642 batches. Here the wall clock runs 1 ms
    # ahead at every read, as a thread preempted between the two reads would see it.
    model = BatcherModel(alpha_s=2e-3, beta_s=0.5e-3, max_batch_size=16, max_queue_delay_s=0.004, instances=2)
    sim = SimBackend(LoadControl(1500), model, seed=3)
    wall = [1e9]

    def ahead() -> float:
        wall[0] += 1e-3
        return wall[0]

    # The simulator's module alone reads this clock: nothing else of the process is touched.
    monkeypatch.setattr(sim_module, "time", SimpleNamespace(time=ahead, monotonic=time.monotonic))
    shown, now = _stepped(sim, 10)
    starts = [b for b, _ in _one_run(sim, model)[1] if b <= now]
    offsets = [e["t_start"] - s for e, s in zip(shown, starts)]
    # One offset, to the µs the page's times are rounded to.
    assert len(shown) > 50 and max(offsets) - min(offsets) <= 2e-6, (min(offsets), max(offsets))


def test_stepping_with_cuts_shows_the_same_batches_as_one_run_over_all_arrivals():
    # 1500 requests/s on 2 instances (about 60% busy): the queue empties often, so the
    # history is cut many times; what the page is shown must be what one run over every
    # arrival gives.
    model = BatcherModel(alpha_s=2e-3, beta_s=0.5e-3, max_batch_size=16, max_queue_delay_s=0.004, instances=2)
    sim = SimBackend(LoadControl(1500), model, seed=3)
    shown, now = _stepped(sim, 60)  # 3 s in 50 ms steps
    assert len(sim.arrivals) < 200, "the history was cut"
    assert len(sim.stats.sent) > 4000
    run, batches = _one_run(sim, model)
    expected = [(n, b) for b, n in batches if b <= now]
    base = shown[0]["t_start"] - expected[0][1]
    assert [e["size"] for e in shown] == [n for n, _ in expected]
    assert [e["t_start"] - base for e in shown] == pytest.approx([b for _, b in expected], abs=1e-4)
    assert sim.stats.answered_total == int(np.sum(run.done <= now))


def test_a_bounded_queue_refuses_under_overload_and_stepping_shows_the_same_as_one_run():
    # 1500 requests/s against one instance that serves 1000/s (batches of 4 in 4 ms), the queue
    # bounded at 50: it fills within a tenth of a second and stays full, never empty again, so the
    # history is cut with requests still queued. What the page is shown, the refusals too, must be
    # what one run over every arrival gives; the queue never passes its bound.
    model = BatcherModel(
        alpha_s=2e-3, beta_s=0.5e-3, max_batch_size=4, max_queue_delay_s=0.004, instances=1, max_queue_size=50
    )
    sim = SimBackend(LoadControl(1500), model, seed=5)
    clock = [0.0]
    sim.now = lambda: clock[0]
    shown, queued, history = [], [], []
    for k in range(1, 61):  # 3 s in 50 ms steps
        clock[0] = 0.05 * k
        events, tick = sim.step()
        shown += events
        queued.append(tick["models"]["simulated"]["queued"])
        history.append(len(sim.arrivals))
    assert max(queued) == 50 and min(queued[10:]) > 40, "full, and never beyond its bound"
    assert max(history) < 400, "the history was cut while the queue stayed full"
    arrivals = np.asarray(sim.stats.sent) - sim.start
    run = simulate(arrivals, model)
    served = ~run.rejected
    done = run.done[served]
    firsts = np.concatenate(([0], np.nonzero(np.diff(done))[0] + 1))
    sizes = np.diff(np.append(firsts, len(done)))
    begins = done[firsts] - (model.alpha_s + model.beta_s * sizes)
    expected = [(int(n), float(b)) for b, n in sorted(zip(begins, sizes)) if b <= clock[0]]
    base = shown[0]["t_start"] - expected[0][1]
    assert [e["size"] for e in shown] == [n for n, _ in expected]
    assert [e["t_start"] - base for e in shown] == pytest.approx([b for _, b in expected], abs=1e-4)
    refused = int(np.sum(run.rejected & (arrivals <= clock[0])))
    ok = int(np.sum(served & (run.done <= clock[0])))
    assert refused > 1000  # about 500 a second
    assert tick["models"]["simulated"]["responses"] == {"OK": ok, "RESOURCE_EXHAUSTED": refused}
    s = sim.stats.summary(sim.start + clock[0])
    assert s["errors"]["RESOURCE_EXHAUSTED"] > 0 and set(s["errors"]) == {"RESOURCE_EXHAUSTED"}
    assert sim.stats.answered_total == ok + refused
    assert s["in_flight"] == int(np.sum((arrivals <= clock[0]) & served & (run.done > clock[0])))


def test_wok_demo_simulate_bounds_its_queue_as_the_live_server_and_shows_the_refusals(start_demo):
    # One instance at 100 ms a batch of 32 serves 320/s; at 5000/s (the most the page takes) the
    # queue fills its 4,096 in about 0.9 s (at 2000/s, 2.5 s). Unbounded, it went on growing (19,169
    # after 12 s at 5,000/s with max batch 1).
    demo = start_demo("--simulate", "--instances", "1", "--alpha", "100ms", "--beta", "0ms", "--rate", "5000")
    assert _get(demo.url + "api/config")["batching"]["max_queue_size"] == 4096
    peak, refused, answered = 0, 0, {}
    with urllib.request.urlopen(demo.url + "api/events", timeout=10) as stream:
        for line in stream:
            if not line.startswith(b"data: "):
                continue
            e = json.loads(line[6:])
            if e["type"] == "tick":
                peak = max(peak, e["models"]["simulated"]["queued"])
                assert peak <= 4096
                answered = e["models"]["simulated"]["responses"]
            elif e["type"] == "load":
                refused = e["errors"].get("RESOURCE_EXHAUSTED", 0)
            if refused and answered.get("RESOURCE_EXHAUSTED"):  # shown as the live demo shows its refusals
                break
    assert peak > 4000
    assert demo.stop() == 0


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_wok_demo_simulate_serves_the_page_and_labels_itself(start_demo):
    demo = start_demo("--simulate", "--rate", "400")
    html = urllib.request.urlopen(demo.url, timeout=10).read().decode()
    assert "/static/demo.js" in html and "<canvas" in html
    assert b"EventSource" in urllib.request.urlopen(demo.url + "static/demo.js", timeout=10).read()
    cfg = _get(demo.url + "api/config")
    assert cfg["mode"] == "simulate" and cfg["faults"] is False
    req = urllib.request.Request(
        demo.url + "api/faults", data=b'{"instance": 0, "mode": "fail"}', headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "not modelled by the simulator" in json.loads(e.value.read())["error"]
    seen = set()
    with urllib.request.urlopen(demo.url + "api/events", timeout=10) as stream:
        for line in stream:
            if line.startswith(b"data: "):
                e = json.loads(line[6:])
                seen.add(e["type"])
                if e["type"] == "load" and e["ok_per_s"] > 100:
                    break
    assert {"config", "batch", "tick", "load"} <= seen
    assert demo.stop() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--instances", "0"], "wok demo: --instances: expected an integer from 1 to 16; got 0\n"),
        (["--rate", "-5"], "wok demo: --rate: expected requests per second from 0 to 5000; got -5\n"),
        (["--max-queue-delay", "soon"], "wok demo: --max-queue-delay: invalid duration 'soon'"),
        (["--max-queue-delay", "100s"], "wok demo: --max-queue-delay: expected at most 60s; got 100s\n"),
        (["--slo", "0ms"], "wok demo: --slo: expected a duration above 0; got 0ms\n"),
        (["--torch-threads", "0"], "wok demo: --torch-threads: expected an integer >= 1; got 0\n"),
        (["--max-batch-size", "1025"], "wok demo: --max-batch-size: expected an integer from 1 to 1024; got 1025\n"),
        (["--port", "65536"], "wok demo: --port: expected an integer from 0 to 65535; got 65536\n"),
        (["--device", "bogus"], f"wok demo: --device: expected {DEVICE_FORMS}; got 'bogus'\n"),
        # \d took every script's digits: "cuda:٣" passed, as the server's config refuses it.
        (["--device", "cuda:٣"], f"wok demo: --device: expected {DEVICE_FORMS}; got 'cuda:٣'\n"),
        # Passed, as the server's config refused them not: torch refuses the first, reads the second as cuda:-128.
        (["--device", "cuda:01"], f"wok demo: --device: expected {DEVICE_FORMS}; got 'cuda:01'\n"),
        (["--device", "cuda:128"], f"wok demo: --device: expected {DEVICE_FORMS}; got 'cuda:128'\n"),
        (["--host", "no-such-host.invalid"], "wok demo: --host: expected an address of this machine; got "),
    ],
)
def test_bad_options_exit_2_naming_them(args, message, capsys):
    from wok.__main__ import main

    assert main(["demo", "--simulate", *args]) == 2
    assert capsys.readouterr().err.startswith(message)
