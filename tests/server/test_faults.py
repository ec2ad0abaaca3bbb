"""Fault injection (server/faults.py) and its hook in the executor's worker; live batching policy."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import ModelExecutionError
from wok.faults import AdminRequestError, Fault, FaultBoard, InstanceFault, parse_fault_request
from wok.stats import ModelStats

from .conftest import saying

INSTANCES = {"mlp": 2, "recsys": 1}


@pytest.mark.parametrize(
    ("body", "field", "got"),
    [
        ([1, 2], "(body)", "[1, 2]"),
        # In the body's words, nested too: it was "[True, None, 'x']", Python's.
        ([True, None, "x"], "(body)", '[true, null, "x"]'),
        ({"model": "nope", "mode": "off"}, "model", "'nope'"),
        ({"mode": "off"}, "model", "null"),
        ({"model": "mlp", "mode": "off", "instance": 2}, "instance", "2"),
        ({"model": "mlp", "mode": "off", "instance": True}, "instance", "true"),
        ({"model": "mlp", "mode": "off", "instance": "0"}, "instance", "'0'"),
        ({"model": "mlp", "mode": "crash"}, "mode", "'crash'"),
        ({"model": "mlp", "mode": "slow"}, "delay_ms", "null"),
        ({"model": "mlp", "mode": "slow", "delay_ms": -1}, "delay_ms", "-1"),
        ({"model": "mlp", "mode": "slow", "delay_ms": "50"}, "delay_ms", "'50'"),
        ({"model": "mlp", "mode": "slow", "delay_ms": float("nan")}, "delay_ms", "NaN"),  # the body's word
        # Beyond a float's range: math.isfinite raised OverflowError on these instead.
        ({"model": "mlp", "mode": "slow", "delay_ms": 10**400}, "delay_ms", "an integer of 401 digits"),
        ({"model": "mlp", "mode": "slow", "delay_ms": -(10**309)}, "delay_ms", "a negative integer of 310 digits"),
        ({"model": "mlp", "mode": "fail", "duration_s": 10**400}, "duration_s", "an integer of 401 digits"),
        ({"model": "mlp", "mode": "slow", "delay_ms": 10**300}, "delay_ms", "1" + "0" * 300),  # a float's range
        ({"model": "mlp", "mode": "fail", "delay_ms": 5}, "delay_ms", "5"),
        ({"model": "mlp", "mode": "fail", "duration_s": 0}, "duration_s", "0"),
        # Ended at once, yet answered and logged as a change made.
        ({"model": "mlp", "mode": "fail", "duration_s": 1e-300}, "duration_s", "1e-300"),
        ({"model": "mlp", "mode": "fail", "duration_s": 0.0009}, "duration_s", "0.0009"),
        ({"model": "mlp", "mode": "off", "duration_s": 3}, "duration_s", "3"),
        ({"model": "mlp", "mode": "off", "colour": "red"}, "colour", "'red'"),
    ],
)
def test_a_bad_request_names_the_field_and_what_came(body, field, got):
    with pytest.raises(AdminRequestError) as e:
        parse_fault_request(body, INSTANCES)
    msg = str(e.value)
    assert msg.startswith(f"field '{field}': expected ") and msg.endswith(f"; got {got}"), msg


@pytest.mark.parametrize(("delay_ms", "got"), [(None, "null"), (-1, "-1"), (60_001, "60001"), ("50", "'50'")])
def test_a_slow_fault_s_bad_delay_is_told_alike_missing_or_out_of_range(delay_ms, got):
    """Every bad delay_ms says the range is mode 'slow''s: the missing field's said so, an out-of-range one's not."""
    body = {"model": "mlp", "mode": "slow"} | ({} if delay_ms is None else {"delay_ms": delay_ms})
    with pytest.raises(AdminRequestError) as e:
        parse_fault_request(body, INSTANCES)
    assert str(e.value) == f"field 'delay_ms': expected a number from 0 to 60000 for mode 'slow'; got {got}"


def test_good_requests_parse():
    body = {"model": "mlp", "instance": 1, "mode": "slow", "delay_ms": 50, "duration_s": 10}
    r = parse_fault_request(body, INSTANCES)
    assert (r.model, r.instance, r.mode, r.delay_ms, r.duration_s) == ("mlp", 1, "slow", 50.0, 10.0)
    r = parse_fault_request({"model": "recsys", "mode": "fail"}, INSTANCES)
    assert (r.instance, r.delay_ms, r.duration_s) == (None, 0.0, None)
    assert parse_fault_request({"model": "mlp", "mode": "fail", "duration_s": 0.001}, INSTANCES).duration_s == 0.001


def _board() -> FaultBoard:
    return FaultBoard([InstanceFault("mlp", 1), InstanceFault("mlp", 0), InstanceFault("recsys", 0)])


def test_board_sets_one_or_all_instances_and_expires_faults():
    board = _board()
    assert board.instances == INSTANCES
    req = parse_fault_request({"model": "mlp", "mode": "fail", "duration_s": 10}, INSTANCES)
    state = board.apply(req, now=100.0, wall=100.0)
    assert state == [
        {"model": "mlp", "instance": 0, "mode": "fail", "delay_ms": None, "until": 110.0},
        {"model": "mlp", "instance": 1, "mode": "fail", "delay_ms": None, "until": 110.0},
    ]
    body = {"model": "mlp", "instance": 1, "mode": "slow", "delay_ms": 50}
    state = board.apply(parse_fault_request(body, INSTANCES), now=105.0)
    assert [(d["instance"], d["mode"], d["delay_ms"], d["until"]) for d in state] == [
        (0, "fail", None, 110.0),
        (1, "slow", 50.0, None),
    ]
    # Past its end the fail fault is gone; the slow one has no end.
    assert [(d["instance"], d["mode"]) for d in board.active(now=110.0)] == [(1, "slow")]
    assert board.apply(parse_fault_request({"model": "mlp", "mode": "off"}, INSTANCES), now=111.0) == []


def test_an_expired_fault_dropped_is_logged_once_with_how_long_it_ran(caplog):
    # Its setting was logged (the admin API's POST), its end never: the log read as a model still failing.
    board = _board()
    board.apply(
        parse_fault_request({"model": "mlp", "instance": 1, "mode": "fail", "duration_s": 10}, INSTANCES), 100.0
    )
    body = {"model": "recsys", "mode": "slow", "delay_ms": 50, "duration_s": 2.5}
    board.apply(parse_fault_request(body, INSTANCES), now=100.0)
    with caplog.at_level(logging.INFO, logger="wok.faults"):
        assert len(board.active(now=102.0)) == 2
        assert board.states["mlp"][1].current(now=111.0) is None  # the worker's read forgets nothing, says nothing
        assert caplog.records == []
        assert [(d["model"], d["mode"]) for d in board.active(now=103.0)] == [("mlp", "fail")]
        assert board.active(now=111.0) == [] and board.active(now=120.0) == [] and board.gauge()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "INFO",
            "fault injection: model 'recsys' instance 0: mode 'slow' (delay_ms 50) ended after its duration_s "
            "of 2.5 s, 0.500 s ago",
        ),
        (
            "INFO",
            "fault injection: model 'mlp' instance 1: mode 'fail' ended after its duration_s of 10 s, 1.000 s ago",
        ),
    ]


ENDED = re.compile(
    r"fault injection: model 'mlp' instance (\d+): mode 'fail' ended after its duration_s of 0\.0105 s, "
    r"\d+\.\d{3} s ago"
)


async def _all_end_unread(count: int) -> FaultBoard:
    board = FaultBoard([InstanceFault("mlp", i) for i in range(count)], asyncio.get_running_loop())
    with saying("wok.faults", "ended after", count) as said:
        # Off the loop's ms grid: uvloop's timer fires up to 1 ms before it, when the fault has not ended yet.
        board.apply(parse_fault_request({"model": "mlp", "mode": "fail", "duration_s": 0.0105}, {"mlp": count}))
        await asyncio.wait_for(said.said.wait(), 10)
    return board


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_fault_s_end_is_logged_at_its_deadline_with_no_read_of_the_state(run_on, loop, caplog):
    # Dropped, and its end logged, only as something read the state (a GET, an /events tick, a scrape): late or never.
    with caplog.at_level(logging.INFO, logger="wok.faults"):
        board = run_on(loop, _all_end_unread(12))
    said = [ENDED.fullmatch(r.getMessage()) for r in caplog.records]
    assert all(said) and sorted(int(m.group(1)) for m in said) == list(range(12)), caplog.messages
    assert board._ends == {} and all(s._fault is None for s in board.states["mlp"])


async def test_a_replaced_or_turned_off_fault_s_timer_is_cancelled_and_says_nothing(caplog):
    states = [InstanceFault("mlp", 0), InstanceFault("mlp", 1), InstanceFault("recsys", 0)]
    board = FaultBoard(states, asyncio.get_running_loop())
    replaced, turned_off = board.states["mlp"]
    with saying("wok.faults", "ended after") as said, caplog.at_level(logging.INFO, logger="wok.faults"):
        board.apply(parse_fault_request({"model": "mlp", "mode": "fail", "duration_s": 0.02}, INSTANCES))
        ends = dict(board._ends)
        assert set(ends) == {replaced, turned_off}
        board.apply(parse_fault_request({"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 5}, INSTANCES))
        board.apply(parse_fault_request({"model": "mlp", "instance": 1, "mode": "off"}, INSTANCES))
        assert ends[replaced].cancelled() and ends[turned_off].cancelled() and board._ends == {}
        # Ends after the replaced ones would have: its line is the first said.
        board.apply(parse_fault_request({"model": "recsys", "mode": "fail", "duration_s": 0.04}, INSTANCES))
        await asyncio.wait_for(said.said.wait(), 10)
    assert [m.split(":")[1] for m in caplog.messages] == [" model 'recsys' instance 0"], caplog.messages
    assert replaced.current() == Fault("slow", 5.0) and turned_off.current() is None


async def test_closing_the_board_cancels_its_timers_and_arms_none_after():
    board = FaultBoard([InstanceFault("mlp", 1), InstanceFault("mlp", 0)], asyncio.get_running_loop())
    board.apply(parse_fault_request({"model": "mlp", "mode": "slow", "delay_ms": 5, "duration_s": 60}, INSTANCES))
    ends = list(board._ends.values())
    assert len(ends) == 2
    board.close()
    assert all(end.cancelled() for end in ends) and board._ends == {}
    board.apply(parse_fault_request({"model": "mlp", "mode": "fail", "duration_s": 60}, INSTANCES))
    assert board._ends == {}
    assert [d["mode"] for d in board.active()] == ["fail", "fail"]  # still set: a read still drops it at its end


def test_a_wall_clock_step_neither_ends_nor_stretches_a_fault(monkeypatch):
    # Expiry was decided on time.time(): a step of the wall clock a day ahead ended a 10 s fault at once.
    board = _board()
    wall = time.time()
    board.apply(parse_fault_request({"model": "mlp", "instance": 0, "mode": "fail", "duration_s": 10}, INSTANCES))
    state = board.states["mlp"][0]
    monkeypatch.setattr(time, "time", lambda: wall + 86_400.0)
    assert [(d["instance"], d["mode"]) for d in board.active()] == [(0, "fail")]
    assert ("mlp", 0, "fail", 1) in board.gauge()
    f = state.current()
    assert f is not None and wall + 10 <= f.until < wall + 20, f  # still shown as Unix time
    # A day back: it still ends at its monotonic deadline, not a day later.
    monkeypatch.setattr(time, "time", lambda: wall - 86_400.0)
    assert board.active(now=f.deadline - 1e-3) != []
    assert board.active(now=f.deadline) == [] and state.current() is None


def test_a_fault_needs_both_its_shown_end_and_its_deadline_or_neither():
    with pytest.raises(ValueError, match="expected until and deadline both set or both None"):
        Fault("fail", until=1.0)
    with pytest.raises(ValueError, match="expected until and deadline both set or both None"):
        Fault("fail", deadline=1.0)


def test_gauge_has_every_instance_and_mode():
    board = _board()
    board.apply(parse_fault_request({"model": "mlp", "instance": 0, "mode": "fail"}, INSTANCES))
    assert sorted(board.gauge()) == [
        ("mlp", 0, "fail", 1),
        ("mlp", 0, "slow", 0),
        ("mlp", 1, "fail", 0),
        ("mlp", 1, "slow", 0),
        ("recsys", 0, "fail", 0),
        ("recsys", 0, "slow", 0),
    ]


def test_before_forward_raises_for_fail_and_says_to_pause_for_slow():
    f = InstanceFault("mlp", 3)
    assert f.before_forward() is False
    f.set(Fault("slow", 25.0))
    assert f.before_forward() is True
    f.set(Fault("slow", 0.0))  # nothing to pause for
    assert f.before_forward() is False
    f.set(Fault("fail"))
    with pytest.raises(ModelExecutionError, match=r"^model 'mlp' instance 3: failing by fault injection$"):
        f.before_forward()
    f.set(Fault("fail", until=1.0, deadline=time.monotonic()))  # ended
    assert f.before_forward() is False and f.current() is None


def _run(executor, rows=2):
    x = np.ones((rows, 4), np.float32)
    return executor.instances[0].submit([{"INPUT0": x}], [rows], 0).result(timeout=30)


def test_slow_fault_adds_its_delay_to_compute_and_fail_fault_fails_before_the_forward(gated):
    _, module, ex = gated()
    inst = ex.instances[0]
    base = _run(ex)
    inst.fault.set(Fault("slow", 80.0))
    slow = _run(ex)
    assert slow.times.compute >= 0.080, slow.times
    assert slow.finished - slow.started >= 0.080
    np.testing.assert_array_equal(slow.outputs[0]["OUTPUT0"], base.outputs[0]["OUTPUT0"])
    inst.fault.set(Fault("fail"))
    calls = len(module.batch_sizes)
    with pytest.raises(ModelExecutionError, match="model 'gated' instance 0: failing by fault injection"):
        _run(ex)
    assert len(module.batch_sizes) == calls, "the forward must not run under a fail fault"
    inst.fault.set(None)
    assert _run(ex).times.compute < 0.080


async def test_set_policy_takes_effect_on_the_next_decision(gated):
    _s, module, ex = gated(max_batch_size=8, delay_ms=10_000.0)
    b = Batcher("gated", ex, BatchingPolicy(8, 10.0), ModelStats("gated"))
    b.start()
    try:
        x = np.ones((1, 4), np.float32)
        first = [b.submit({"INPUT0": x}, 1, (), None) for _ in range(3)]
        await asyncio.sleep(0)  # a 10 s delay window: nothing flushes by itself
        assert b.queued == 3
        # A smaller maximum makes the queue full: a size flush of 2, then 1 is left.
        b.set_policy(BatchingPolicy(2, 10.0))
        await asyncio.wait_for(asyncio.gather(*(p.future for p in first[:2])), 10)
        assert module.batch_sizes[-1] == 2 and b.queued == 1
        # A zero delay window flushes the last one at once.
        b.set_policy(BatchingPolicy(2, 0.0))
        await asyncio.wait_for(first[2].future, 10)
        assert module.batch_sizes[-1] == 1
        assert b.stats.flushes == {"size": 1, "delay": 1}
        # A queued request with more rows than a new maximum runs alone.
        b.set_policy(BatchingPolicy(4, 10.0))
        big = b.submit({"INPUT0": np.ones((3, 4), np.float32)}, 3, (), None)
        b.set_policy(BatchingPolicy(2, 10.0))
        await asyncio.wait_for(big.future, 10)
        assert module.batch_sizes[-1] == 3
    finally:
        await b.stop()


class _SetsAFaultAsItIsCompared(float):
    """A clock reading whose comparison sets `fault` on `state` first: the admin's POST on the event
    loop landing while the worker's thread is between its read of the expired fault and its verdict."""

    def __new__(cls, value: float, state: InstanceFault, fault: Fault):
        self = super().__new__(cls, value)
        self.state, self.fault = state, fault
        return self

    def __ge__(self, other):
        self.state.set(self.fault)
        return float(self) >= other


def test_a_fault_set_while_an_expired_one_is_read_is_kept():
    # The worker's read of an expired fault wrote None back: a fault the admin set meanwhile was
    # wiped, though its POST had answered 200 with it active.
    state = InstanceFault("mlp", 0)
    state.set(Fault("slow", 10.0, until=100.0, deadline=100.0))
    new = Fault("fail")
    assert state.current(_SetsAFaultAsItIsCompared(200.0, state, new)) is None  # the read saw the old one, ended
    assert state.current() is new
    with pytest.raises(ModelExecutionError, match="failing by fault injection"):
        state.before_forward()
