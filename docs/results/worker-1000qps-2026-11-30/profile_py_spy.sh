#!/bin/bash
# py-spy on `wok serve --models mlp` at 1,000 QPS (open loop), and the model worker's CPU per batch
# over the same 8 s. Usage (from the repository root, under the CPU lock):
#   bash docs/results/worker-1000qps-2026-11-30/profile_py_spy.sh OUTDIR
set -e
D=${1:?output folder}
mkdir -p "$D"
.venv/bin/wok serve --models mlp --port 18001 --metrics-port 18002 --log-level warning > "$D/serve.log" 2>&1 &
SP=$!
for _ in $(seq 50); do sleep 0.2; ss -ltn | grep -q ':18001 ' && break; done
sleep 1
.venv/bin/wok bench ramp --target 127.0.0.1:18001 --model mlp --steps 1000 --step-duration 25s --warmup 2s \
    --json "$D/ramp.json" > "$D/ramp.log" 2>&1 &
RP=$!
sleep 8
WT=$(for t in /proc/$SP/task/*; do grep -q wok-run-0 "$t/comm" && basename "$t"; done | head -1)
b0=$(curl -s localhost:18002/metrics | awk '/^wok_batch_size_count/{print $2}')
c0=$(awk '{print $1}' "/proc/$SP/task/$WT/schedstat")
.venv/bin/py-spy record --nonblocking --threads --idle -r 250 -d 8 -f raw -o "$D/py-spy-raw.txt" -p $SP > "$D/spy.log" 2>&1
b1=$(curl -s localhost:18002/metrics | awk '/^wok_batch_size_count/{print $2}')
c1=$(awk '{print $1}' "/proc/$SP/task/$WT/schedstat")
echo "batches $b0 -> $b1; worker cpu ns $c0 -> $c1" > "$D/py-spy-cpu.txt"
python3 -c "print('worker CPU per batch us', ($c1-$c0)/1e3/($b1-$b0))" >> "$D/py-spy-cpu.txt"
wait $RP
kill -INT $SP; wait $SP || true
