#!/usr/bin/env bash
# weir beside the MQTT brokers an operator would otherwise run, measured
# with the same load generator (weir-load: MQTT 3.1.1, QoS 1, 4 connections
# x 1000 in flight, fresh incompressible payloads), one system at a time,
# each started fresh and stopped before the next:
#
#   mosquitto     Debian's Mosquitto 2.0, in memory, one QoS 1 subscriber
#   rumqttd       rumqttd 0.20.0 (cargo install, pinned), one QoS 1 subscriber
#   weir-file     weir, file egress (no subscriber: weir takes none)
#
# Every weir runs its default config (`weir print-default-config`) but for
# the listen addresses, the egress and the spool directory: what a user
# who installs it gets.
#   weir-grpc     the same weir fed over gRPC (PublishStream, 4 streams x
#                 1000 in flight) instead of MQTT
#   weir-amqp     weir into a durable classic RabbitMQ queue, memory mode
#   weir-spool    the same with every class durability = "spool"
#
# for each record size at full rate, then each system paced at --rate
# (50,000 records/s) with --paced-size (256 B) bytes: PUBLISH-to-PUBACK
# percentiles at a load every system carries. Every measurement is a JSON
# line in $OUT/results.jsonl ({"system", "size", "mode", "report"}); the
# table (markdown) and chart are `weir-lab peers` of it, written to
# $OUT/peers.json and $OUT/peers.svg. Usage:
#
#   scripts/peer-bench.sh [--seconds 10] [--sizes 256,1024,16384] [--out DIR] [--systems a,b]
#                         [--rate 50000] [--paced-size 256]   (--rate 0: no paced runs)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
seconds=10
sizes=256,1024,16384
out=${TMPDIR:-/tmp}/weir-peer-bench
systems=mosquitto,rumqttd,weir-file,weir-grpc,weir-amqp,weir-spool
rate=50000
paced_size=256
rumqttd_version=0.20.0
rumqttd_root=${RUMQTTD_ROOT:-$HOME/.cache/weir-peer-bench/rumqttd-$rumqttd_version}
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --paced-size) paced_size=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--sizes 256,1024] [--out DIR] [--systems mosquitto,rumqttd,weir-file,weir-grpc,weir-amqp,weir-spool] [--rate 50000] [--paced-size 256]" >&2; exit 2 ;;
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
(cd "$repo" && cargo build --release -q -p weir -p weir-load -p weir-lab)
load=$repo/target/release/weir-load
weir=$repo/target/release/weir
lab=$repo/target/release/weir-lab

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 100); do port_open "$1" && return 0; sleep 0.1; done; echo "nothing on port $1" >&2; return 1; }

# record SYSTEM SIZE JSON-FILE: one line of results.jsonl ($mode: full or paced).
record() {
  jq -c --arg system "$1" --argjson size "$2" --arg mode "$mode" \
    '{system: $system, size: $size, mode: $mode, report: .}' "$3" >>"$results"
}

# run_broker SYSTEM SIZE PORT PID [--no-subscriber]
run_broker() {
  local system=$1 size=$2 port=$3 pid=$4; shift 4
  "$load" --json "$out/$system-$size-$mode.json" broker --addr "127.0.0.1:$port" --pid "$pid" \
    --size "$size" --seconds "$seconds" "${pacing[@]}" "$@" >"$out/$system-$size-$mode.txt" 2>&1
  record "$system" "$size" "$out/$system-$size-$mode.json"
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

sed -e 's/^listen = "127.0.0.1:18830"/listen = "127.0.0.1:18835"/' \
    -e 's/^enabled = false/enabled = true\nlisten = "127.0.0.1:18840"\nmax_message_size = "1MiB"/' \
    "$out/weir-file.toml" >"$out/weir-grpc.toml"

IFS=, read -ra size_list <<<"$sizes"
IFS=, read -ra system_list <<<"$systems"

# measure SYSTEM SIZE: one measurement with $mode and ${pacing[@]}.
measure() {
    local system=$1 size=$2
    echo "peer-bench: $system, $size B, $mode"
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
      weir-file|weir-grpc)
        # Each run writes into its own directory, all deleted at the end:
        # ext4 without a journal (this VM's root) skips, reading each,
        # every inode freed in the last 60-360 s when it allocates one, so
        # a create after deleting thousands of batch files costs many times
        # its usual CPU. Only when the disk runs short are they deleted
        # early, and the next run waits the window out.
        dir=$out/batches/$system-$size-$mode
        if [ "$(df --output=avail -k "$out" | tail -1)" -lt $((12 << 20)) ]; then
          echo "peer-bench: less than 12 GiB free, deleting earlier batch files and waiting 6 min"
          rm -rf "$out/batches"; sleep 360
        fi
        mkdir -p "$dir"
        sed "s#^dir = .*#dir = \"$dir\"#" "$out/$system.toml" >"$out/$system-run.toml"
        "$weir" run --config "$out/$system-run.toml" >"$out/$system.log" 2>&1 &
        pid=$!
        if [ "$system" = weir-file ]; then
          wait_port 18830
          run_broker weir-file "$size" 18830 "$pid" --no-subscriber
        else
          wait_port 18840
          "$load" --json "$out/$system-$size-$mode.json" grpc --addr 127.0.0.1:18840 --pid "$pid" \
            --size "$size" --seconds "$seconds" "${pacing[@]}" >"$out/$system-$size-$mode.txt" 2>&1
          record "$system" "$size" "$out/$system-$size-$mode.json"
        fi
        kill "$pid"; wait "$pid" 2>/dev/null || true ;;
      weir-amqp)
        "$load" --json "$out/$system-$size-$mode.json" throughput --size "$size" --seconds "$seconds" \
          "${pacing[@]}" >"$out/$system-$size-$mode.txt" 2>&1
        record "$system" "$size" "$out/$system-$size-$mode.json" ;;
      weir-spool)
        "$load" --json "$out/$system-$size-$mode.json" throughput --size "$size" --seconds "$seconds" \
          "${pacing[@]}" --durability spool --spool-dir "$out" >"$out/$system-$size-$mode.txt" 2>&1
        record "$system" "$size" "$out/$system-$size-$mode.json" ;;
      *) echo "peer-bench: unknown system $system" >&2; exit 2 ;;
    esac
}

mode=full
pacing=()
for size in "${size_list[@]}"; do
  for system in "${system_list[@]}"; do measure "$system" "$size"; done
done
if [ "$rate" != 0 ]; then
  mode=paced-$rate
  pacing=(--rate "$rate")
  for system in "${system_list[@]}"; do measure "$system" "$paced_size"; done
fi

rm -rf "$out/batches"

# The table and the chart.
"$lab" --out "$out" peers --input "$results"
echo "peer-bench: JSON lines in $results, chart in $out/peers.svg"
