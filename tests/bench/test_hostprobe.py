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
        (0.0, 0.005, "host probe: seconds must be > 0 and finite, got 0.0"),
        (math.nan, 0.005, "host probe: seconds must be > 0 and finite, got nan"),
        (math.inf, 0.005, "host probe: seconds must be > 0 and finite, got inf"),
        (1.0, 0.0, "host probe: gap_s must be > 0 and finite, got 0.0"),
        (1.0, math.inf, "host probe: gap_s must be > 0 and finite, got inf"),
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
