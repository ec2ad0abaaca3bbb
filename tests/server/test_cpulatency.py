"""The PM QoS request behind `cpu_wakeup_latency_us`: held while open, gone when closed."""

from __future__ import annotations

import os
import re

import pytest

from wok.config import server_settings
from wok.cpulatency import DEVICE, CpuWakeupLatency, read_constraint
from wok.errors import ConfigError

needs_device = pytest.mark.skipif(
    not os.access(DEVICE, os.W_OK), reason=f"{DEVICE} is missing or not writable by this user (root's by default)"
)


@needs_device
def test_the_request_bounds_the_system_while_held_and_ends_with_release():
    before = read_constraint()
    # A value no other process on a test machine holds, below the default 2,000 s.
    want = min(before - 1, 1_234_567)
    req = CpuWakeupLatency(want)
    req.acquire()
    try:
        assert req.held
        assert read_constraint() == want
        inner = CpuWakeupLatency(0)  # the smallest held value is the system's bound
        inner.acquire()
        assert read_constraint() == 0
        inner.release()
        assert read_constraint() == want
    finally:
        req.release()
    assert not req.held
    assert read_constraint() == before
    req.release()  # twice is harmless


def test_a_device_that_cannot_be_opened_names_itself_and_the_setting(tmp_path):
    missing = tmp_path / "no-such-device"
    req = CpuWakeupLatency(0, path=str(missing))
    with pytest.raises(OSError, match=re.escape(f"cpu_wakeup_latency_us=0: cannot open {missing}")):
        req.acquire()
    assert not req.held


def test_negative_latencies_are_refused_with_the_value():
    with pytest.raises(ValueError, match=re.escape("must be >= 0 µs; got -5")):
        CpuWakeupLatency(-5)
    with pytest.raises(ConfigError, match=re.escape("cpu_wakeup_latency_us: Input should be greater than or equal")):
        server_settings(cpu_wakeup_latency_us=-1)
    assert server_settings().cpu_wakeup_latency_us is None
