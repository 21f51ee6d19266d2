#!/usr/bin/env bash
# weir beside the MQTT brokers an operator would otherwise run, measured
# with the same load generator (weir-load: MQTT 3.1.1, QoS 1, 4 connections
# x 1000 in flight, fresh incompressible payloads), one system at a time,
# each started fresh and stopped before the next:
#
#   mosquitto     Debian's Mosquitto 2.0, in memory, one QoS 1 subscriber
#   rumqttd       rumqttd 0.20.0 (cargo install, pinned), one QoS 1 subscriber
#   weir-file     weir, file egress (no subscriber: weir takes none)
#   weir-amqp     weir into a durable classic RabbitMQ queue, memory mode
#   weir-spool    the same with every class durability = "spool"
#
# for each record size. Every measurement is a JSON line in
# $OUT/results.jsonl ({"system", "size", "report"}) and a row of the table
# printed at the end. Usage:
#
#   scripts/peer-bench.sh [--seconds 10] [--sizes 256,1024,16384] [--out DIR] [--systems a,b]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
seconds=10
sizes=256,1024,16384
out=${TMPDIR:-/tmp}/weir-peer-bench
systems=mosquitto,rumqttd,weir-file,weir-amqp,weir-spool
rumqttd_version=0.20.0
rumqttd_root=${RUMQTTD_ROOT:-$HOME/.cache/weir-peer-bench/rumqttd-$rumqttd_version}
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--sizes 256,1024] [--out DIR] [--systems mosquitto,rumqttd,weir-file,weir-amqp,weir-spool]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"

bash "$here/services.sh" >/dev/null
if [[ ,$systems, == *,rumqttd,* ]] && [ ! -x "$rumqttd_root/bin/rumqttd" ]; then
  echo "peer-bench: installing rumqttd $rumqttd_version into $rumqttd_root"
  # Not --locked: its lock file pins metrics 0.22.1, which current rustc refuses.
  cargo install rumqttd --version "$rumqttd_version" --root "$rumqttd_root" >"$out/rumqttd-install.log" 2>&1
fi
(cd "$repo" && cargo build --release -q -p weir -p weir-load)
load=$repo/target/release/weir-load
weir=$repo/target/release/weir

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 100); do port_open "$1" && return 0; sleep 0.1; done; echo "nothing on port $1" >&2; return 1; }

# record SYSTEM SIZE JSON-FILE: one line of results.jsonl.
record() {
  jq -c --arg system "$1" --argjson size "$2" '{system: $system, size: $size, report: .}' "$3" >>"$results"
}

# run_broker SYSTEM SIZE PORT PID [--no-subscriber]
run_broker() {
  local system=$1 size=$2 port=$3 pid=$4; shift 4
  "$load" --json "$out/$system-$size.json" broker --addr "127.0.0.1:$port" --pid "$pid" \
    --size "$size" --seconds "$seconds" "$@" >"$out/$system-$size.txt" 2>&1
  record "$system" "$size" "$out/$system-$size.json"
}

cat >"$out/mosquitto.conf" <<EOF
listener 18832 127.0.0.1
allow_anonymous true
persistence false
max_inflight_messages 1000
max_queued_messages 100000
EOF
cat >"$out/rumqttd.toml" <<EOF
id = 0
[router]
id = 0
max_connections = 10010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10
[v4.1]
name = "v4-1"
listen = "127.0.0.1:18831"
next_connection_delay_ms = 1
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 20480
    max_inflight_count = 1000
    dynamic_filters = true
EOF
cat >"$out/weir-file.toml" <<EOF
[node]
id = 1
[scheduler]
uplink = "10Gbit/s"
burst = "1MiB"
max_batch_records = 1024
max_batch_bytes = "1MiB"
[ingress.mqtt]
listen = "127.0.0.1:18830"
[ingress.grpc]
enabled = false
[egress]
kind = "file"
[egress.file]
dir = "$out/weir-file-out"
[log]
level = "warn"
EOF

cleaned=0
IFS=, read -ra size_list <<<"$sizes"
IFS=, read -ra system_list <<<"$systems"
for size in "${size_list[@]}"; do
  for system in "${system_list[@]}"; do
    echo "peer-bench: $system, $size B"
    case $system in
      mosquitto)
        mosquitto -c "$out/mosquitto.conf" >"$out/mosquitto.log" 2>&1 &
        pid=$!; wait_port 18832
        run_broker mosquitto "$size" 18832 "$pid"
        kill "$pid"; wait "$pid" 2>/dev/null || true ;;
      rumqttd)
        (cd "$out" && exec "$rumqttd_root/bin/rumqttd" --config "$out/rumqttd.toml" -q >"$out/rumqttd.log" 2>&1) &
        pid=$!; wait_port 18831
        run_broker rumqttd "$size" 18831 "$(pgrep -P "$pid" -x rumqttd || echo "$pid")"
        kill "$pid" 2>/dev/null; pkill -x rumqttd || true; wait "$pid" 2>/dev/null || true ;;
      weir-file)
        rm -rf "$out/weir-file-out"
        # ext4 without a journal (this VM's root) skips inodes freed in the
        # last 30 s when it allocates one, reading each: a create right
        # after deleting thousands of batch files costs many times its
        # usual CPU. Let the last clean-up age first.
        while [ $(( $(date +%s) - cleaned )) -lt 35 ]; do sleep 1; done
        "$weir" run --config "$out/weir-file.toml" >"$out/weir-file.log" 2>&1 &
        pid=$!; wait_port 18830
        run_broker weir-file "$size" 18830 "$pid" --no-subscriber
        kill "$pid"; wait "$pid" 2>/dev/null || true
        rm -rf "$out/weir-file-out"; cleaned=$(date +%s) ;;
      weir-amqp)
        "$load" --json "$out/$system-$size.json" throughput --size "$size" --seconds "$seconds" >"$out/$system-$size.txt" 2>&1
        record "$system" "$size" "$out/$system-$size.json" ;;
      weir-spool)
        "$load" --json "$out/$system-$size.json" throughput --size "$size" --seconds "$seconds" \
          --durability spool --spool-dir "$out" >"$out/$system-$size.txt" 2>&1
        record "$system" "$size" "$out/$system-$size.json" ;;
      *) echo "peer-bench: unknown system $system" >&2; exit 2 ;;
    esac
  done
done

# The table: acknowledged records/s, and the system's CPU per record.
echo
printf '%-11s %6s %12s %12s\n' system size "acked/s" "us/record"
jq -r '
  [ .system, (.size|tostring),
    ((.report.acked_per_sec // .report.acked_per_sec_mean // .report.records_per_sec // 0) | floor | tostring),
    ((.report.broker_us_per_record // .report.cpu.weir_us_per_record // 0) * 100 | floor / 100 | tostring) ]
  | @tsv' "$results" | while IFS=$'\t' read -r s z a u; do printf '%-11s %6s %12s %12s\n' "$s" "$z" "$a" "$u"; done
echo "peer-bench: JSON lines in $results"
