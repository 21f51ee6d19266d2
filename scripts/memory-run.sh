#!/usr/bin/env bash
# weir's memory over a long run at full rate: weir with its
# default capacities publishing into a durable classic RabbitMQ queue with
# confirms, driven by weir-load (MQTT QoS 1, 4 x 1000 in flight, as fast as
# acknowledged), weir's resident memory sampled every 5 s. RabbitMQ keeps
# only the newest 256 MiB of batches (x-max-length-bytes; drop-head still
# confirms), so the run needs no consumer and never trips RabbitMQ's
# memory or disk alarm (which would block weir and end the full rate); the queue is
# deleted at the end (not x-expires: publishing does not count as use,
# so the queue would vanish under load).
#
#   scripts/memory-run.sh [--seconds 600] [--size 256] [--out DIR]
#
# Prints the samples' first, last and largest RSS and the growth over the
# second half; writes $OUT/rss.csv (seconds, KiB) and $OUT/load.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
seconds=600
size=256
out=${TMPDIR:-/tmp}/weir-memory-run
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds 600] [--size 256] [--out DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
bash "$here/services.sh" >/dev/null
(cd "$repo" && cargo build --release -q -p weir -p weir-load)
cat >"$out/weir.toml" <<CONF
[node]
id = 1
[scheduler]
uplink = "10Gbit/s"
burst = "1MiB"
max_batch_bytes = "1MiB"
[ingress.mqtt]
listen = "127.0.0.1:18850"
[ingress.grpc]
enabled = false
[egress]
kind = "amqp"
[egress.amqp]
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
exchange = ""
queue = "weir.memory-run"
routing_key = "weir.memory-run"
queue_arguments = { x-max-length-bytes = 268435456 }
[log]
level = "warn"
CONF
"$repo/target/release/weir" run --config "$out/weir.toml" >"$out/weir.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rabbitmqctl -q delete_queue weir.memory-run >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/18850) 2>/dev/null && break; sleep 0.1; done
"$repo/target/release/weir-load" --json "$out/load.json" broker --addr 127.0.0.1:18850 --pid "$pid" \
  --no-subscriber --size "$size" --seconds "$seconds" --warmup 3 >"$out/load.txt" 2>&1 &
load=$!
: >"$out/rss.csv"
start=$(date +%s)
while kill -0 "$load" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
  echo "$(( $(date +%s) - start )),$rss" >>"$out/rss.csv"
  sleep 5
done
wait "$load"
cat "$out/load.txt"
awk -F, -v half=$((seconds / 2)) '
  NR == 1 { first = $2 } { last = $2; if ($2 > max) max = $2 }
  $1 >= half && !mid { mid = $2 }
  END { printf "RSS first %.1f MiB, last %.1f MiB, largest %.1f MiB, second half %+.1f MiB\n",
        first / 1024, last / 1024, max / 1024, (last - mid) / 1024 }' "$out/rss.csv"
