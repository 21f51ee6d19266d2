#!/usr/bin/env bash
# Builds the container images (scripts/image.sh) and runs them as a user
# would, with podman: the amd64 image under --memory 64m --cpus 0.5, MQTT
# records published from outside through a port mapping, its health
# check, `podman stop` (drains, exits 0), the batches read back from the
# mounted volume, and the spool kept across a `podman kill` and a restart
# on the same volume; the arm64 and armhf images' binaries run under qemu
# with the image's own loader and libraries. Part of the test command
# (scripts/test.sh).
#
# Runs where podman can (root on Debian: podman is installed if missing);
# elsewhere it says why it skipped. On such a machine it never skips: a
# podman that cannot run a container fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/arch.sh

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "image-check: skipped: needs root on Debian (podman, cross builds); docs/container.md"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
need=()
command -v podman >/dev/null || need+=(podman runc)
command -v mosquitto_pub >/dev/null || need+=(mosquitto-clients)
command -v curl >/dev/null || need+=(curl)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

bash scripts/image.sh amd64 arm64 armhf
version=$("$(bin_of amd64)" --version | awk '{print $2}')
image=localhost/weir:$version-amd64

work=$(mktemp -d)
name=weir-image-check-$$
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# Some machines (this CI's among them) forbid raising rlimits, which
# podman's default ulimits do; the container keeps podman's own instead.
printf '[containers]\ndefault_ulimits = []\n' >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf

mqtt=18831
admin=18832
vol=$work/volume
mkdir -p "$vol"
chown 65532:65532 "$vol"

# podman's own complaints (without systemd it cannot time the health
# check, which this script runs itself) go to a log, shown on failure.
plog=$work/podman.log
fail() {
  echo "image-check: FAILED: $*" >&2
  tail -20 "$plog" >&2 || true
  podman logs "$name" 2>&1 | tail -30 >&2 || true
  exit 1
}

# Starts the amd64 image on the volume, with extra podman arguments;
# prints the seconds from `podman run` to /healthz answering.
start() {
  local t0 t1
  t0=$(date +%s.%N)
  podman run -d --name "$name" --memory 64m --cpus 0.5 \
    -p "127.0.0.1:$mqtt:1883" -p "127.0.0.1:$admin:9464" \
    -v "$vol:/var/lib/weir" "$@" "$image" >/dev/null 2>>"$plog"
  for _ in $(seq 400); do
    if curl -sf "http://127.0.0.1:$admin/healthz" >/dev/null; then
      t1=$(date +%s.%N)
      awk "BEGIN{printf \"%.2f\", $t1 - $t0}"
      return 0
    fi
    sleep 0.05
  done
  fail "weir did not answer /healthz within 20 s"
}

# The records in the volume's segments whose payload starts with `prefix`.
delivered() {
  local n=0 seg
  for seg in "$vol"/out/*.weirseg; do
    [ -e "$seg" ] || continue
    n=$((n + $("$(bin_of amd64)" decode "$seg" | grep -c "payload=\"$1-" || true)))
  done
  echo "$n"
}

metric() {
  curl -sf "http://127.0.0.1:$admin/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {printf "%d\n", s}'
}

# Publishes records <prefix>-1..<n> with QoS 1 to `topic` from outside.
publish() {
  seq 1 "$1" | sed "s/^/$2-/" |
    mosquitto_pub -h 127.0.0.1 -p "$mqtt" -q 1 -t "$3" -l ||
    fail "mosquitto_pub could not publish the $2 records through the port mapping"
}

# Waits (up to `tries` x 50 ms) until `metric <name>` compares with
# `value` as `op` ([ ] operators).
until_metric() {
  for _ in $(seq "$4"); do
    [ "$(metric "$1")" "$2" "$3" ] && return 0
    sleep 0.05
  done
  return 0
}

# podman stop: weir must drain and exit 0.
stop_ok() {
  podman stop -t 20 "$name" >/dev/null 2>>"$plog"
  local code
  code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
  [ "$code" = 0 ] || fail "podman stop $1: weir exited with $code, not 0"
}

# 1. The image as shipped: publish, health check, stop, read back.
up=$(start)
pid=$(podman inspect --format '{{.State.Pid}}' "$name")
idle_rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
podman healthcheck run "$name" >/dev/null 2>&1 || fail "the image's health check failed"
publish 2000 shipped site/7/temperature
until_metric weir_records_accepted_total -ge 2000 200
stop_ok "of the shipped image"
podman logs "$name" 2>&1 | grep -q "shut down cleanly" || fail "no clean shutdown in the log"
podman rm "$name" >/dev/null 2>>"$plog"
got=$(delivered shipped)
[ "$got" = 2000 ] || fail "$got of 2000 records in the volume's segments after podman stop"
echo "image-check: amd64 image (--memory 64m --cpus 0.5): /healthz after ${up} s, idle RSS $((idle_rss / 1024)) MiB; 2000 of 2000 MQTT records in the volume after podman stop (exit 0)"

# 2. The spool across podman kill: every class spooled, the egress a
# RabbitMQ that is not there, so acknowledged records stay on disk; then
# a restart on the same volume with the file egress delivers them.
sed 's|^durability = "memory"|durability = "spool"|' target/image/weir.toml >"$work/spool.toml"
sed -e 's|^kind = "file"|kind = "amqp"|' -e '/^\[egress\.file\]$/,/^$/d' "$work/spool.toml" >"$work/outage.toml"
printf '\n[egress.amqp]\nurl = "amqp://guest:guest@127.0.0.1:1/%%2f"\n' >>"$work/outage.toml"
chmod 0644 "$work"/*.toml
start -v "$work/outage.toml:/etc/weir/weir.toml:ro" >/dev/null
publish 3000 spooled site/7/vibration
until_metric weir_spool_records -ge 3000 200
spooled=$(metric weir_spool_records)
[ "$spooled" -ge 3000 ] || fail "$spooled of 3000 records in the spool before the kill"
podman kill "$name" >/dev/null 2>>"$plog"
podman wait "$name" >/dev/null 2>>"$plog" || true
podman rm "$name" >/dev/null 2>>"$plog"
start -v "$work/spool.toml:/etc/weir/weir.toml:ro" >/dev/null
until_metric weir_spool_records = 0 400
stop_ok "after the restart"
podman rm "$name" >/dev/null 2>>"$plog"
got=$(delivered spooled)
[ "$got" = 3000 ] || fail "$got of 3000 spooled records delivered after podman kill and a restart"
echo "image-check: amd64 image: 3000 of 3000 spooled records kept across podman kill and delivered after a restart on the same volume"

# 3. arm64 and armhf: the image's binary runs on the image's own loader
# and libraries (qemu), and reads the image's config.
for arch in arm64 armhf; do
  root=$work/$arch
  mkdir -p "$root"
  ctr=$(podman create --platform "linux/$arch" "localhost/weir:$version-$arch")
  podman export "$ctr" | tar -x -C "$root"
  podman rm "$ctr" >/dev/null
  case "$arch" in
    arm64) qemu=qemu-aarch64-static ;;
    armhf) qemu=qemu-arm-static ;;
  esac
  "$qemu" -L "$root" "$root/usr/bin/weir" --version >/dev/null || fail "$arch: the image's weir does not run"
  "$qemu" -L "$root" "$root/usr/bin/weir" check-config "$root/etc/weir/weir.toml" >/dev/null ||
    fail "$arch: the image's weir refuses the image's config"
  echo "image-check: $arch image: its weir runs under qemu on the image's libraries and accepts its config"
done

# The size: at most 1.5 times the stripped binary.
for arch in amd64 arm64 armhf; do
  read -r size binsize <<<"$(image_sizes "$version" "$arch")"
  [ $((size * 2)) -le $((binsize * 3)) ] || fail "$arch image $size bytes, over 1.5x the binary ($binsize)"
done
echo "image-check: passed"
