#!/usr/bin/env bash
# The link sweep: weir's default config against a grid of hand-tuned
# settings on real shaped links (network namespace, tc tbf, the lab's delay
# line towards RabbitMQ), one node, 256 B records offered at 1.7x the
# link's rate (5 % ls, 15 % nm, 80 % lt). Needs root (namespaces, tc) and
# RabbitMQ on loopback (bash scripts/services.sh).
#
#   bash scripts/link-sweep.sh [--rates 1,4,18,100,1000] [--rtts 5,50,200]
#        [--batches 16KiB,256KiB,4MiB] [--windows 2,64] [--seconds 10]
#        [--out DIR]
#
# Each run's JSON goes to DIR/<rate>mbit-<rtt>ms/<config>/cluster.json;
# DIR/sweep.md gets the table (python3 scripts/link-sweep-table.py DIR
# rebuilds it). docs/lab/link-sweep.md has the method and the figures.
set -euo pipefail

rates=1,4,18,100,1000
rtts=5,50,200
batches=16KiB,256KiB,4MiB
windows=2,64
seconds=10
size=256
out=/tmp/weir-link-sweep
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --rtts) rtts=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --windows) windows=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--rates 1,4,18,100,1000] [--rtts 5,50,200] [--batches 16KiB,256KiB,4MiB] [--windows 2,64] [--seconds 10] [--out DIR]" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
(cd "$repo" && cargo build --release -q --locked -p weir -p weir-load -p weir-lab)
lab=$repo/target/release/weir-lab
mkdir -p "$out"

run() { # run DIR NETWORK LS NM LT [extra weir-lab args...]
  local dir=$1 net=$2 ls=$3 nm=$4 lt=$5; shift 5
  mkdir -p "$dir"
  echo "link-sweep: $net ${*:-default}" >&2
  "$lab" --out "$dir" cluster --defaults --nodes 1 --busy 1 --schemes pmrfs \
    --networks "$net" --record-bytes "$size" --busy-rates "$ls,$nm" --lt-rates "$lt" \
    --idle-rate 0 --seconds "$seconds" "$@" >"$dir/run.log" 2>&1 ||
    echo "link-sweep: $net ${*:-default} failed (see $dir/run.log)" >&2
}

IFS=, read -r -a rate_list <<<"$rates"
IFS=, read -r -a rtt_list <<<"$rtts"
IFS=, read -r -a batch_list <<<"$batches"
IFS=, read -r -a window_list <<<"$windows"
for rate in "${rate_list[@]}"; do
  # 1.7x the link in records of $size bytes: 5 % ls, 15 % nm, 80 % lt.
  total=$(python3 -c "print(round(1.7 * $rate * 1e6 / 8 / $size))")
  ls=$(python3 -c "print(max(1, round($total * 0.05)))")
  nm=$(python3 -c "print(max(1, round($total * 0.15)))")
  lt=$(python3 -c "print(max(1, round($total * 0.80)))")
  for rtt in "${rtt_list[@]}"; do
    net="${rate}Mbit/s@${rtt}ms"
    cell="$out/${rate}mbit-${rtt}ms"
    run "$cell/default" "$net" "$ls" "$nm" "$lt"
    for b in "${batch_list[@]}"; do
      for w in "${window_list[@]}"; do
        run "$cell/tuned-$b-w$w" "$net" "$ls" "$nm" "$lt" --max-batch-bytes "$b" --max-in-flight "$w"
      done
    done
  done
done
python3 "$repo/scripts/link-sweep-table.py" "$out" | tee "$out/sweep.md"
