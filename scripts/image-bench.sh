#!/usr/bin/env bash
# The container image's figures (docs/container.md): image size per
# architecture against the stripped binary, start-up to listening inside
# the container, and weir's resident memory idle and under 5,000 MQTT QoS 1
# records/s of 256 B, the amd64 image under --memory 64m --cpus 0.5.
#
#   bash scripts/image-bench.sh            # after scripts/image.sh
#
# The load comes from weir-load on the host, through the port mapping.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/arch.sh

version=$(target/release/weir --version | awk '{print $2}')
image=localhost/weir:$version-amd64
podman image exists "$image" || bash scripts/image.sh amd64
[ -x target/release/weir-load ] || cargo build --release --locked -p weir-load
rate=${RATE:-5000}
seconds=${SECONDS_RUN:-30}

work=$(mktemp -d)
name=weir-image-bench-$$
trap 'podman rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
printf '[containers]\ndefault_ulimits = []\n' >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
mkdir -p "$work/volume"
chown 65532:65532 "$work/volume"

echo "| image | size KiB | stripped binary KiB | ratio |"
echo "|---|---|---|---|"
for arch in amd64 arm64 armhf; do
  podman image exists "localhost/weir:$version-$arch" || continue
  read -r size binsize <<<"$(image_sizes "$version" "$arch")"
  echo "| $arch | $((size / 1024)) | $((binsize / 1024)) | $(awk "BEGIN{printf \"%.2f\", $size/$binsize}") |"
done

t0=$(date +%s%N)
podman run -d --name "$name" --memory 64m --cpus 0.5 \
  -p 127.0.0.1:18841:1883 -p 127.0.0.1:18842:9464 \
  -v "$work/volume:/var/lib/weir" "$image" >/dev/null 2>>"$work/podman.log"
until curl -sf http://127.0.0.1:18842/healthz >/dev/null; do sleep 0.01; done
t1=$(date +%s%N)
# Inside: from the runtime starting the process to weir's line saying the
# MQTT listener accepts (both UTC, nanoseconds).
started=$(date -d "$(podman inspect --format '{{.State.StartedAt}}' "$name" | sed 's/ [A-Z]*$//')" +%s%N)
listening=$(date -d "$(podman logs "$name" 2>&1 | grep -m1 'accepting device connections' | awk '{print $1}')" +%s%N)
pid=$(podman inspect --format '{{.State.Pid}}' "$name")
sleep 2
idle=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
# The container's CPU time in nanoseconds (cgroup v1 or v2).
cpu_ns() {
  local v1 v2
  v1=$(awk -F: '$2 ~ /(^|,)cpuacct(,|$)/ {print $2 ":" $3}' "/proc/$pid/cgroup")
  v2=$(awk -F: '$1 == 0 {print $3}' "/proc/$pid/cgroup")
  if [ -n "$v1" ] && [ -r "/sys/fs/cgroup/${v1%%:*}${v1#*:}/cpuacct.usage" ]; then
    cat "/sys/fs/cgroup/${v1%%:*}${v1#*:}/cpuacct.usage"
  elif [ -r "/sys/fs/cgroup$v2/cpu.stat" ]; then
    awk '$1 == "usage_usec" {print $2 * 1000}' "/sys/fs/cgroup$v2/cpu.stat"
  else
    echo 0
  fi
}
cpu0=$(cpu_ns)
(
  while kill -0 "$pid" 2>/dev/null; do
    awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true
    sleep 0.2
  done
) >"$work/rss" &
sampler=$!
target/release/weir-load offer --addr 127.0.0.1:18841 --rates "lt=$rate" --size 256 \
  --seconds "$seconds" 2>&1 | grep '^offer:'
cpu1=$(cpu_ns)
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
peak=$(sort -n "$work/rss" | tail -1)
echo
echo "podman run to /healthz answering: $(((t1 - t0) / 1000000)) ms"
echo "process start to MQTT listening (inside): $(((listening - started) / 1000000)) ms"
echo "RSS idle: $((idle / 1024)) MiB; peak at $rate records/s of 256 B: $((peak / 1024)) MiB"
[ "$cpu1" != 0 ] && echo "CPU under load: $(awk "BEGIN{printf \"%.3f\", ($cpu1 - $cpu0) / 1e9 / $seconds}") cores (limit 0.5)"
podman stop -t 20 "$name" >/dev/null 2>>"$work/podman.log"
echo "podman stop: exit $(podman inspect --format '{{.State.ExitCode}}' "$name")"
