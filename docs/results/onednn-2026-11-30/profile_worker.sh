#!/bin/bash
# Where the mlp's model worker spends its CPU at 1,000 QPS: `perf record` (cpu-clock, no hardware
# counters in this VM) on the worker thread of a `wok serve --models mlp` while `wok bench ramp`
# offers 1,000 QPS open loop, plus the server's per-thread CPU ticks over the same 15 s.
# Usage (from the repository root, under the CPU lock): bash docs/results/onednn-2026-11-30/profile_worker.sh OUTDIR [serve args...]
set -e
D=${1:?output folder}; shift
mkdir -p "$D"
.venv/bin/wok serve --models mlp --port 18001 --no-metrics --log-level warning "$@" > "$D/serve.log" 2>&1 &
SP=$!
for _ in $(seq 50); do sleep 0.2; ss -ltn | grep -q ':18001 ' && break; done
sleep 1
.venv/bin/wok bench ramp --target 127.0.0.1:18001 --model mlp --steps 1000 --step-duration 40s --warmup 2s \
    --json "$D/ramp.json" > "$D/ramp.log" 2>&1 &
RP=$!
sleep 8
WT=$(for t in /proc/$SP/task/*; do grep -q wok-run-0 "$t/comm" && basename "$t"; done | tr '\n' , | sed 's/,$//')
snap() { for t in /proc/$SP/task/*; do echo "$(cat "$t/comm") $(awk '{print $14+$15}' "$t/stat")"; done; }
snap > "$D/ticks-before"
perf record -e cpu-clock -F 4000 -g -t "$WT" -o "$D/perf.data" -- sleep 15 > "$D/perf.log" 2>&1
snap > "$D/ticks-after"
wait $RP
kill -INT $SP; wait $SP || true
perf report -i "$D/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | head -40 > "$D/top-symbols.txt"
