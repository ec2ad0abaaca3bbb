"""bench/hostprobe.py: the reading's shape and bounds, and its refusals."""

from __future__ import annotations

import pytest

from wok.bench import hostprobe


def test_a_reading_has_its_fields_and_a_sample_count_the_time_allows():
    r = hostprobe.probe(0.2, gap_s=0.005)
    assert r["schema"] == "wok.hostprobe/1"
    assert (r["seconds"], r["gap_ms"]) == (0.2, 5.0)
    # Each cycle sleeps twice 5 ms, so 0.2 s holds at most 20 (the first is discarded).
    assert 1 <= r["samples"] <= 19
    assert r["cold_forward_us"] > 0 and r["warm_forward_us"] > 0 and r["cold_read_us"] > 0
    assert r["cold_forward_p90_us"] >= r["cold_forward_us"]


def test_a_probe_shorter_than_a_cycle_still_reads_once():
    r = hostprobe.probe(0.004, gap_s=0.004)
    assert r["samples"] == 1 and r["cold_forward_us"] > 0


@pytest.mark.parametrize(
    ("seconds", "gap", "message"),
    [
        (0.0, 0.005, "host probe: seconds must be > 0, got 0.0"),
        (float("nan"), 0.005, "host probe: seconds must be > 0, got nan"),
        (1.0, 0.0, "host probe: gap_s must be in (0, seconds=1], got 0.0"),
        (0.01, 0.02, "host probe: gap_s must be in (0, seconds=0.01], got 0.02"),
    ],
)
def test_bad_arguments_are_refused_with_what_was_given(seconds, gap, message):
    with pytest.raises(ValueError) as exc:
        hostprobe.probe(seconds, gap_s=gap)
    assert str(exc.value) == message


def test_combined_is_the_mean_of_the_cold_medians_it_has():
    assert hostprobe.combined([{"cold_forward_us": 100.0}, {"cold_forward_us": 300.0}]) == 200.0
    assert hostprobe.combined([None, {"cold_forward_us": 120.0}]) == 120.0
    assert hostprobe.combined([None, None]) is None
