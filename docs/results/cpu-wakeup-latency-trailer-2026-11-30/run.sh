#!/bin/bash
# usage: run.sh tag mode  (mode: plain | qos0 | poll200)
set -e
cd /work/main
tag=$1; mode=$2
port=$((20000 + RANDOM % 20000))
holder=
if [ $mode = qos0 ]; then .venv/bin/python /tmp/idle/hold.py 0 & holder=$!; fi
if [ $mode = poll200 ]; then echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns; fi
.venv/bin/wok serve --models mlp --port $port --metrics-port 0 --server-timing > /tmp/idle/$tag.server.log 2>&1 &
srv=$!
for i in $(seq 50); do grep -q -i "serving\|listening" /tmp/idle/$tag.server.log && break; sleep 0.2; done
sleep 1
.venv/bin/wok bench ramp --target 127.0.0.1:$port --model mlp --steps 100 --step-duration 20s --warmup 1s \
    --server-timing --metrics-url none --json /tmp/idle/$tag.json > /tmp/idle/$tag.log 2>&1 || true
kill $srv; wait $srv || true
[ -n "$holder" ] && kill $holder
echo 0 > /sys/module/haltpoll/parameters/guest_halt_poll_ns
python3 -c "
import json;d=json.load(open('/tmp/idle/$tag.json'));s=d['steps'][0];st=s['server_timing']
print('$tag', 'p50 %.2f p99 %.2f' % (s['latency_ms']['p50'], s['latency_ms']['p99']), 'outside p50/p99 %.2f/%.2f' % (st['outside_ms']['p50'], st['outside_ms']['p99']), 'server p99 %.2f' % st['stages_ms']['total']['p99'], 'compute p50/p99 %.2f/%.2f'%(st['stages_ms']['compute']['p50'],st['stages_ms']['compute']['p99']), 'lag p99 %.2f'%s['dispatch_lag_ms']['p99'])
"
