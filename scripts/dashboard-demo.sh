#!/usr/bin/env bash
# A real run behind docs/img/dashboard.png: two peered weir nodes (release
# build) scraped every second by a real Prometheus (Debian's package), node
# 1 on a 2 Mbit/s emulated uplink and loaded over MQTT by mosquitto_pub in
# three classes, lt stepping up past the uplink at 60 s (overflow goes to
# node 2), ls's bound loosened by SIGHUP at 150 s; then every panel of
# contrib/grafana/weir.json is queried from Prometheus and drawn
# (scripts/render-dashboard.py).
#
#   bash scripts/dashboard-demo.sh [SECONDS]     # default 210
#
# Needs: cargo build --release -p weir; apt-get install prometheus
# mosquitto-clients python3-matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-210}
weir=$PWD/target/release/weir
[ -x "$weir" ] || { echo "build first: cargo build --release -p weir" >&2; exit 1; }
for c in prometheus mosquitto_pub; do
  command -v "$c" >/dev/null || { echo "missing $c (apt-get install prometheus mosquitto-clients)" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/weir-dashboard.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

node() { # id mqtt admin peering peer_id peer_port link
  cat >"$dir/node$1.toml" <<EOF
[node]
id = $1
[[class]]
name = "ls"
bound = "100ms"
[[class]]
name = "nm"
bound = "500ms"
[[class]]
name = "lt"
bound = "1s"
[classify]
default_class = "lt"
[[classify.route]]
mqtt = "ls/#"
class = "ls"
[[classify.route]]
mqtt = "nm/#"
class = "nm"
[ingress.mqtt]
listen = "127.0.0.1:$2"
[ingress.grpc]
enabled = false
[admin]
listen = "127.0.0.1:$3"
[peering]
listen = "127.0.0.1:$4"
peers = [{ id = $5, addr = "127.0.0.1:$6" }]
[egress.file]
dir = "$dir/out$1"
[egress.link]
$7
EOF
  "$weir" run --config "$dir/node$1.toml" 2>"$dir/node$1.log" &
  pids+=($!)
}
node 1 21883 29464 27071 2 27072 'bandwidth = "2Mbit/s"
delay = "20ms"'
node 2 21884 29465 27072 1 27071 'bandwidth = "20Mbit/s"
delay = "20ms"'

cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: weir
    static_configs:
      - targets: ["127.0.0.1:29464", "127.0.0.1:29465"]
EOF
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address=127.0.0.1:29090 >"$dir/prometheus.log" 2>&1 &
pids+=($!)
sleep 3
start=$(date +%s)

# `rate` lines per second of `size` bytes for `secs` seconds, from `after`.
load() { # topic rate size secs after
  python3 - "$2" "$3" "$4" "$5" <<'EOF' | mosquitto_pub -p 21883 -q 1 -t "$1" -l
import sys, time, random, string
rate, size, secs, after = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
time.sleep(after)
t0 = time.time(); i = 0
while time.time() - t0 < secs:
    i += 1
    sys.stdout.write("".join(random.choices(string.ascii_letters, k=size)) + "\n")
    if i % 10 == 0:
        sys.stdout.flush()
        lag = t0 + i / rate - time.time()
        if lag > 0:
            time.sleep(lag)
EOF
}
load ls/press 100 200 "$secs" 0 &
pids+=($!)
load nm/cooling 150 500 "$secs" 0 &
pids+=($!)
load lt/bulk 60 1000 "$secs" 0 &
pids+=($!)
load lt/bulk 240 1000 $((secs - 60)) 60 &
pids+=($!)
sleep 150
# A looser ls bound, by SIGHUP.
sed -i '0,/bound = "100ms"/s//bound = "150ms"/' "$dir/node1.toml"
kill -HUP "${pids[0]}"
sleep $((secs - 150))
end=$(date +%s)
sleep 2
# Debian's python3 has python3-matplotlib; a pyenv one first in PATH may not.
py=python3
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && py=/usr/bin/python3
"$py" scripts/render-dashboard.py --prometheus http://127.0.0.1:29090 \
  --start "$start" --end "$end" --out docs/img/dashboard.png --instance 127.0.0.1:29464 \
  --require "Latency p99 against the bound,Arrivals,Queue depth,Token rate per class (BWAllocator),Uplink: estimate and use,Codec chosen and ratio,Peers' spare and shortage,Redirected records,Config reloads"
grep -q "config reloaded" "$dir/node1.log" || { echo "dashboard-demo: the reload was not applied" >&2; exit 1; }
echo "dashboard-demo: logs and data in $dir"
trap - EXIT
cleanup
