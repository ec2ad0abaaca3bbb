#!/bin/bash
# One 20 s step at 100 QPS against a fresh `wok serve --server-timing`, from the repository root:
#   bash docs/results/cpu-wakeup-latency-trailer-2026-11-30/run.sh TAG MODE OUTDIR
# MODE: plain | qos0 (this folder's hold.py holds the bound at 0 µs during the run) | poll200
# (guest halt-polling at 200 µs: /sys/module/haltpoll/parameters/guest_halt_poll_ns).
# Run as root under the CPU lock; the files here came from pairs `plain`, `qos0` in turn.
set -e
tag=$1; mode=$2; out=${3:-/tmp/idle}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
holder=
if [ "$mode" = qos0 ]; then .venv/bin/python "$here/hold.py" 0 & holder=$!; fi
poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ "$mode" = poll200 ]; then was=$(cat $poll); echo 200000 > $poll; fi
.venv/bin/wok serve --models mlp --port $port --metrics-port 0 --server-timing > "$out/$tag.server.log" 2>&1 &
srv=$!
for _ in $(seq 50); do grep -q "wok: serving" "$out/$tag.server.log" && break; sleep 0.2; done
sleep 1
.venv/bin/wok bench ramp --target 127.0.0.1:$port --model mlp --steps 100 --step-duration 20s --warmup 1s \
    --server-timing --metrics-url none --json "$out/$tag.json" > "$out/$tag.log" 2>&1 || true
kill $srv; wait $srv || true
[ -n "$holder" ] && kill $holder
if [ "$mode" = poll200 ]; then echo "$was" > $poll; fi
