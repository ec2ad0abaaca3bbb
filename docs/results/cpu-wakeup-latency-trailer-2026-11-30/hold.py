import os, struct, sys, signal
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
os.write(fd, struct.pack("i", int(sys.argv[1])))
signal.sigwait({signal.SIGTERM, signal.SIGINT})
