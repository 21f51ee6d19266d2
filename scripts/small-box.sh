#!/usr/bin/env bash
# A small box: weir alone in a cgroup of 64 MiB and half a core, with the
# default configuration (every class in memory; only the listeners and the
# egress changed), QoS 1 records arriving at 3,000/s while RabbitMQ is
# unreachable for 30 s, then the drain. Reports whether weir was OOM-killed,
# its peak memory, what was acknowledged and what reached RabbitMQ.
#
#   bash scripts/small-box.sh            (needs root, RabbitMQ on 5672,
#                                         socat, a release build)
#
# Environment: MEMORY (bytes, default 64 MiB), CPU (cores, 0.5), RATE
# (records/s, 3000), SIZE (payload bytes, 512), OUTAGE (s, 30), BEFORE (s
# of load before the outage, 5), AFTER (s of load after it, 30),
# MEMORY_LIMIT (weir's node.memory_limit, default: not set, i.e. "auto").
# docs/durability.md ("A small box") has the figures.
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
cd "$(dirname "$0")/.."

weir=${WEIR:-target/release/weir}
load=${WEIR_LOAD:-target/release/weir-load}
memory=${MEMORY:-$((64 << 20))}
cpu=${CPU:-0.5}
rate=${RATE:-3000}
size=${SIZE:-512}
outage=${OUTAGE:-30}
before=${BEFORE:-5}
after=${AFTER:-30}
for f in "$weir" "$load"; do
  [ -x "$f" ] || { echo "small-box: $f missing: cargo build --release -p weir -p weir-load" >&2; exit 1; }
done
command -v socat >/dev/null || { echo "small-box: needs socat" >&2; exit 1; }

work=$(mktemp -d /tmp/weir-small-box.XXXXXX)
name="small-box-$$"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mqtt=$(port); admin=$(port); proxy_port=$(port)

# RabbitMQ behind socat on a port of its own: the outage stops socat (its
# connections reset, new ones refused), as a dead uplink would.
proxy=""
proxy_up() { socat "TCP-LISTEN:$proxy_port,fork,reuseaddr,bind=127.0.0.1" TCP:127.0.0.1:5672 & proxy=$!; }
proxy_down() { kill "$proxy" 2>/dev/null || true; pkill -f "TCP-LISTEN:$proxy_port" 2>/dev/null || true; }

# The default configuration, listeners and egress changed.
grpc=$(port)
"$weir" print-default-config | python3 -c '
import sys
mqtt, grpc, admin, proxy, state, queue = sys.argv[1:]
out, skip = [], False
for line in sys.stdin.read().splitlines():
    if line.startswith("["):
        skip = line.strip() == "[egress.file]"
    if skip:
        continue
    line = line.replace("listen = \"127.0.0.1:1883\"", f"listen = \"127.0.0.1:{mqtt}\"")
    line = line.replace("listen = \"127.0.0.1:50051\"", f"listen = \"127.0.0.1:{grpc}\"")
    line = line.replace("# listen = \"127.0.0.1:9464\"", f"listen = \"127.0.0.1:{admin}\"")
    line = line.replace("kind = \"file\"", "kind = \"amqp\"")
    line = line.replace("dir = \"/var/lib/weir/spool\"", f"dir = \"{state}\"")
    out.append(line)
out += ["[egress.amqp]", f"url = \"amqp://guest:guest@127.0.0.1:{proxy}/%2f\"", f"queue = \"{queue}\""]
print("\n".join(out))
' "$mqtt" "$grpc" "$admin" "$proxy_port" "$work/state" "$name" >"$work/weir.toml"
if [ -n "${MEMORY_LIMIT:-}" ]; then
  sed -i "s|^memory_limit = \"auto\"|memory_limit = \"$MEMORY_LIMIT\"|" "$work/weir.toml"
fi
"$weir" check-config "$work/weir.toml" >"$work/check.txt"

# The cgroup: v1 (memory and cpu hierarchies) or v2.
if [ -d /sys/fs/cgroup/memory ]; then
  mem_cg=/sys/fs/cgroup/memory/$name; cpu_cg=/sys/fs/cgroup/cpu/$name
  mkdir -p "$mem_cg" "$cpu_cg"
  echo "$memory" >"$mem_cg/memory.limit_in_bytes"
  echo 100000 >"$cpu_cg/cpu.cfs_period_us"
  echo "$(awk "BEGIN{print int($cpu * 100000)}")" >"$cpu_cg/cpu.cfs_quota_us"
  procs=("$mem_cg/cgroup.procs" "$cpu_cg/cgroup.procs")
  peak() { cat "$mem_cg/memory.max_usage_in_bytes"; }
  ooms() { awk '/oom_kill /{print $2}' "$mem_cg/memory.oom_control"; }
else
  cg=/sys/fs/cgroup/$name
  echo "+memory +cpu" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir -p "$cg"
  echo "$memory" >"$cg/memory.max"
  echo "$(awk "BEGIN{print int($cpu * 100000)}") 100000" >"$cg/cpu.max"
  procs=("$cg/cgroup.procs")
  peak() { cat "$cg/memory.peak" 2>/dev/null || echo 0; }
  ooms() { awk '/oom_kill /{print $2}' "$cg/memory.events"; }
fi
cleanup() {
  proxy_down
  [ -n "${weir_pid:-}" ] && kill "$weir_pid" 2>/dev/null || true
  sleep 1
  for p in "${procs[@]}"; do rmdir "$(dirname "$p")" 2>/dev/null || true; done
}
trap cleanup EXIT

proxy_up
# weir alone in the cgroup: the shell moves itself in, then becomes weir.
bash -c "for p in ${procs[*]}; do echo \$\$ > \$p; done; exec $weir run --config $work/weir.toml" 2>"$work/weir.log" &
weir_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$mqtt") 2>/dev/null && break; sleep 0.1; done

seconds=$((before + outage + after))
"$load" offer --addr "127.0.0.1:$mqtt" --rates "lt=$rate" --size "$size" \
  --seconds "$seconds" --json "$work/offer.json" >"$work/offer.txt" 2>&1 &
load_pid=$!
sleep "$before"
echo "small-box: RabbitMQ unreachable for ${outage} s"
proxy_down
sleep "$outage"
proxy_up
echo "small-box: RabbitMQ back"
wait "$load_pid" || true
# The drain: until weir's queues are empty (or it is gone).
for _ in $(seq 120); do
  kill -0 "$weir_pid" 2>/dev/null || break
  queued=$( (curl -s "127.0.0.1:$admin/metrics" || true) | awk '/^weir_class_queued_records\{/{s+=$2} END{print s+0}')
  [ "$queued" = 0 ] && break
  sleep 1
done
alive=yes; kill -0 "$weir_pid" 2>/dev/null || alive=no
peak_bytes=$(peak); oom=$(ooms)
kill -TERM "$weir_pid" 2>/dev/null || true
wait "$weir_pid" 2>/dev/null || true
weir_pid=""
"$weir" consume --url "amqp://guest:guest@127.0.0.1:5672/%2f" --queue "$name" \
  --output "$work/out.jsonl" --idle-exit 5s 2>"$work/consume.log" || true
consumed=$(wc -l <"$work/out.jsonl")
acked=$(python3 -c "import json; r=json.load(open('$work/offer.json')); print(sum(c['acked'] for c in r['classes']))")
echo "small-box: memory limit $((memory >> 20)) MiB, ${cpu} cores, ${rate} records/s of ${size} B, outage ${outage} s"
grep -ho "memory limit.*\|no memory limit.*" "$work/weir.log" | head -1 | sed 's/^/small-box: weir derived: /'
echo "small-box: weir alive after the drain: $alive; OOM kills: ${oom:-0}; peak memory $((peak_bytes >> 20)) MiB"
echo "small-box: acknowledged $acked, consumed $consumed distinct records (lost: $((acked > consumed ? acked - consumed : 0)))"
echo "small-box: files in $work"
