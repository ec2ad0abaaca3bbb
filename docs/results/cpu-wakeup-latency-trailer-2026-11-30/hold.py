"""Hold a CPU wake-up latency bound (µs, argv[1]) on /dev/cpu_dma_latency until SIGTERM or SIGINT."""

import os
import signal
import struct
import sys

fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
os.write(fd, struct.pack("=i", int(sys.argv[1])))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
signal.sigwait({signal.SIGTERM, signal.SIGINT})
