"""Keep idle CPUs quick to wake while the server runs: a Linux PM QoS request on /dev/cpu_dma_latency.

At light load every request wakes several threads in turn (gRPC's poller, the event loop, the
model's worker, the loop again, gRPC again), most of them on a core that went idle since the
last request. An idle core sleeps in the deepest state its idle governor allows. In a virtual
machine that is a halt (at once where guest halt-polling is off, as on the development machine's
`haltpoll.guest_halt_poll_ns=0`; after up to 200 µs of polling by haltpoll's default), and waking
a halted vCPU is an interrupt through the hypervisor (tens of µs, more on a busy host) for every
hop. Linux lets a process bound that: while a file descriptor on /dev/cpu_dma_latency holds a
value (µs), the idle governor picks no state whose exit latency exceeds it; 0 keeps idle cores
polling. The request lasts as long as the descriptor is open, so it ends with the server, even
if the process dies.

The cost is power, and in a VM the host's CPU: a polling idle core is busy to the hypervisor.
Off by default; `wok serve --cpu-wakeup-latency US`. docs/performance.md has the measurement.
"""

from __future__ import annotations

import errno
import os
import struct

DEVICE = "/dev/cpu_dma_latency"
# What the device reads with no request held (PM_QOS_CPU_LATENCY_DEFAULT_VALUE, 2000 s).
NO_CONSTRAINT_US = 2_000_000_000
_S32 = struct.Struct("=i")


def read_constraint(path: str = DEVICE) -> int:
    """The system's effective wake-up latency bound in µs: the smallest value any process holds."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _S32.unpack(os.read(fd, _S32.size))[0]
    finally:
        os.close(fd)


class CpuWakeupLatency:
    """Holds a PM QoS CPU latency request of `latency_us` between `acquire()` and `release()`."""

    def __init__(self, latency_us: int, path: str = DEVICE) -> None:
        if not 0 <= latency_us <= NO_CONSTRAINT_US:
            raise ValueError(f"cpu wake-up latency: expected 0 to {NO_CONSTRAINT_US} µs; got {latency_us}")
        self.latency_us = latency_us
        self.path = path
        self._value = _S32.pack(latency_us)
        self._fd = -1

    def __enter__(self) -> CpuWakeupLatency:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> None:
        """Open the device and write the bound; raises OSError naming the device and the setting."""
        if self.held:
            return
        try:
            # Not inherited across exec (os.open's default too): a child must not hold the bound
            # after the server ends. Nothing in the server forks.
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            hint = " (it is root's by default)" if exc.errno in (errno.EPERM, errno.EACCES) else ""
            raise OSError(
                exc.errno,
                f"cpu_wakeup_latency_us={self.latency_us}: cannot open {self.path}{hint}: {exc.strerror}",
            ) from None
        try:
            os.write(fd, self._value)
        except OSError as exc:
            os.close(fd)
            raise OSError(
                exc.errno, f"cpu_wakeup_latency_us={self.latency_us}: cannot write {self.path}: {exc.strerror}"
            ) from None
        self._fd = fd

    def release(self) -> None:
        """Drop the request (closing the descriptor is what removes it)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
