"""bench/hostprobe.py: the reading's shape and bounds, that it loads no other core, and its refusals."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from wok.bench import hostprobe


def test_a_reading_has_its_fields_and_a_sample_count_the_time_allows():
    r = hostprobe.probe(0.2, gap_s=0.005)
    assert r["schema"] == "wok.hostprobe/2"
    assert (r["seconds"], r["gap_ms"], r["threads"], r["torch"]) == (0.2, 5.0, 1, torch.__version__)
    # Each cycle sleeps twice 5 ms, so 0.2 s holds at most 20 (the first is discarded).
    assert 1 <= r["samples"] <= 19
    assert r["cold_forward_us"] > 0 and r["warm_forward_us"] > 0 and r["cold_read_us"] > 0


def test_a_probe_shorter_than_a_cycle_still_reads_once():
    r = hostprobe.probe(0.004, gap_s=0.004)
    assert r["samples"] == 1 and r["cold_forward_us"] > 0


def test_the_probe_sleeps_and_loads_no_other_core():
    # A BLAS helper thread spinning between products (numpy's OpenBLAS did) would cost about a
    # core for the whole probe; the probe's own work is a few hundred µs per 10 ms cycle.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cpu0, wall0 = os.times(), time.perf_counter()
        hostprobe.probe(0.5)
        cpu1, wall = os.times(), time.perf_counter() - wall0
        assert torch.get_num_threads() == 2  # given back as it was
    finally:
        torch.set_num_threads(threads)
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    assert cpu < 0.5 * wall, f"the probe used {cpu:.2f} s of CPU in {wall:.2f} s"


@pytest.mark.parametrize(
    ("seconds", "gap", "message"),
    [
        (0.0, 0.005, "host probe: seconds: expected a finite number > 0; got 0.0"),
        (math.nan, 0.005, "host probe: seconds: expected a finite number > 0; got nan"),
        (math.inf, 0.005, "host probe: seconds: expected a finite number > 0; got inf"),
        (1.0, 0.0, "host probe: gap_s: expected a finite number > 0; got 0.0"),
        (1.0, math.inf, "host probe: gap_s: expected a finite number > 0; got inf"),
    ],
)
def test_bad_arguments_are_refused_with_what_was_given(seconds, gap, message):
    with pytest.raises(ValueError) as exc:
        hostprobe.probe(seconds, gap_s=gap)
    assert str(exc.value) == message


def test_combined_is_the_mean_of_the_cold_medians_it_has():
    assert hostprobe.combined([{"cold_forward_us": 100.0}, {"cold_forward_us": 300.0}]) == 200.0
    assert hostprobe.combined([None, {"cold_forward_us": 120.0}]) == 120.0
    assert hostprobe.combined([{"error": "RuntimeError: x"}, {"cold_forward_us": 90.0}]) == 90.0
    assert hostprobe.combined([None, {"error": "RuntimeError: x"}]) is None


def test_try_probe_is_off_at_zero_and_turns_a_failure_into_a_record(monkeypatch):
    said = []
    assert hostprobe.try_probe(0, said.append) is None
    assert hostprobe.try_probe(0.01, said.append)["samples"] >= 1

    def broken(seconds):
        raise OSError("no clock")

    monkeypatch.setattr(hostprobe, "probe", broken)
    assert hostprobe.try_probe(0.01, said.append) == {"schema": "wok.hostprobe/2", "error": "OSError: no clock"}
    assert said == ["warning: host probe failed: OSError: no clock"]


def test_around_keeps_both_readings_and_their_mean():
    before, after = {"cold_forward_us": 100.0}, {"error": "OSError: x"}
    assert hostprobe.around(before, after) == {"before": before, "after": after, "cold_forward_us": 100.0}


class _ScriptedClock:
    """time for the probe: perf_counter gives the readings a probe of `cycles` (read, cold, warm: seconds,
    exact binary fractions) takes, in the order it takes them; sleeping takes no time."""

    def __init__(self, cycles: list[tuple[float, float, float]], seconds: float) -> None:
        readings = [0.0]  # the start: the probe ends `seconds` after it
        for i, (read, cold, warm) in enumerate(cycles):
            if i >= 2:  # the first two cycles run whatever the clock says
                readings.append(0.0)  # still before the end
            readings += [0.0, read, 0.0, cold, cold + warm]  # around the sum, the forward, the forward again
        readings.append(2 * seconds)  # past the end: no further cycle
        self.perf_counter = iter(readings).__next__

    def sleep(self, seconds: float) -> None:
        pass


def test_the_readings_medians_and_p90_are_nearest_rank(monkeypatch):
    """docs/bench-schema.md: percentiles are nearest-rank, the ⌈p·n⌉-th smallest. numpy's median of four
    cold forwards of 0.25, 0.5, 0.75, 1 s read 0.625 s, a time no forward took, and its P90 0.925 s."""
    first = (9.0, 9.0, 9.0)  # discarded
    cycles = [first, (0.5, 1.0, 0.25), (0.25, 0.25, 0.25), (0.5, 0.75, 0.75), (0.125, 0.5, 0.75)]
    monkeypatch.setattr(hostprobe, "time", _ScriptedClock(cycles, seconds=1.0))
    r = hostprobe.probe(1.0)
    assert r["samples"] == 4
    # cold 0.25, 0.5, 0.75, 1: the 2nd of 4 and the 4th (⌈3.6⌉); warm 0.25, 0.25, 0.75, 0.75: the 2nd
    # (numpy: 0.5, between the ties); the reads 0.125, 0.25, 0.5, 0.5: the 2nd (numpy: 0.375).
    figures = ("cold_forward_us", "cold_forward_p90_us", "warm_forward_us", "cold_read_us")
    assert {k: r[k] for k in figures} == dict(zip(figures, (5e5, 1e6, 2.5e5, 2.5e5)))
