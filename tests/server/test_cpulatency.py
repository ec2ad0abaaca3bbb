"""The PM QoS request behind `cpu_wakeup_latency_us`: held while open, gone when closed."""

from __future__ import annotations

import os
import re

import pytest

from wok.config import server_settings
from wok.cpulatency import NO_CONSTRAINT_US, CpuWakeupLatency, read_constraint
from wok.errors import ConfigError


def test_the_request_bounds_the_system_while_held_and_ends_with_release(cpu_latency_before):
    before = cpu_latency_before
    # A value no other process on a test machine holds, below what the machine has now.
    want = min(before - 1, 1_234_567)
    req = CpuWakeupLatency(want)
    req.acquire()
    try:
        assert req.held
        assert read_constraint() == want
        with CpuWakeupLatency(0) as inner:  # the smallest held value is the system's bound
            assert inner.held
            assert read_constraint() == 0
        assert not inner.held
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


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here (Linux has it)")
def test_a_failed_write_names_the_device_and_leaves_no_descriptor_open():
    # /dev/full opens for writing and refuses every write (ENOSPC): the write path's failure.
    fds = len(os.listdir("/proc/self/fd"))
    req = CpuWakeupLatency(7, path="/dev/full")
    with pytest.raises(OSError, match=re.escape("cpu_wakeup_latency_us=7: cannot write /dev/full")):
        req.acquire()
    assert not req.held
    assert len(os.listdir("/proc/self/fd")) == fds


def test_latencies_outside_the_device_range_are_refused_with_the_value():
    with pytest.raises(
        ValueError, match=re.escape(f"cpu wake-up latency: expected 0 to {NO_CONSTRAINT_US} µs; got -5")
    ):
        CpuWakeupLatency(-5)
    with pytest.raises(ValueError, match=re.escape(f"got {2**31}")):
        CpuWakeupLatency(2**31)  # would not fit the device's signed 32 bits
    with pytest.raises(ConfigError, match=re.escape("cpu_wakeup_latency_us: expected >= 0; got -1")):
        server_settings(cpu_wakeup_latency_us=-1)
    with pytest.raises(
        ConfigError,
        match=re.escape(f"cpu_wakeup_latency_us: expected <= {NO_CONSTRAINT_US}; got {NO_CONSTRAINT_US + 1}"),
    ):
        server_settings(cpu_wakeup_latency_us=NO_CONSTRAINT_US + 1)
    assert server_settings().cpu_wakeup_latency_us is None
