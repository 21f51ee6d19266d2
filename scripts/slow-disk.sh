#!/usr/bin/env bash
# Bounds on a busy box with a slow disk (docs/benchmarks.md):
# `weir-load contention` with the `lt` class spooled on a throttled device
# and `ls`, `nm` in memory. The device is a loop-mounted ext4 file system
# whose writes weir makes through a cgroup-v1 blkio throttle (default 20
# write IOs/s and 1 MiB/s: an fdatasync of 64 KiB takes about 100 ms, an
# SD card on a bad day). Needs root. Everything is torn down on exit.
#
#   scripts/slow-disk.sh [--iops N] [--bps BYTES] [-- weir-load contention args]
set -euo pipefail
cd "$(dirname "$0")/.."
IOPS=20
BPS=$((1024 * 1024))
while [ $# -gt 0 ]; do
  case "$1" in
    --iops) IOPS=$2; shift 2 ;;
    --bps) BPS=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "slow-disk.sh: needs root (loop device, mount, blkio cgroup)" >&2; exit 2; }
BLKIO=/sys/fs/cgroup/blkio
[ -e "$BLKIO/blkio.throttle.write_iops_device" ] || { echo "slow-disk.sh: no cgroup-v1 blkio throttle at $BLKIO" >&2; exit 2; }

WORK=$(mktemp -d /tmp/weir-slow-disk.XXXX)
IMG=$WORK/disk.img
MNT=$WORK/mnt
CG=$BLKIO/weir-slow-disk-$$
LOOP=""
cleanup() {
  set +e
  if [ -d "$CG" ]; then
    # Whatever is left in the cgroup goes back to the root before removal.
    while read -r p; do echo "$p" > "$BLKIO/cgroup.procs"; done < "$CG/cgroup.procs"
    rmdir "$CG"
  fi
  mountpoint -q "$MNT" && umount "$MNT"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$WORK"
}
trap cleanup EXIT

truncate -s 1G "$IMG"
LOOP=$(losetup -f --show "$IMG")
mkfs.ext4 -q -F "$LOOP"
mkdir -p "$MNT"
mount "$LOOP" "$MNT"
MAJMIN=$(lsblk -dno MAJ:MIN "$LOOP" | tr -d ' ')
mkdir "$CG"
echo "$MAJMIN $IOPS" > "$CG/blkio.throttle.write_iops_device"
echo "$MAJMIN $BPS" > "$CG/blkio.throttle.write_bps_device"
echo "slow-disk.sh: $LOOP ($MAJMIN) on $MNT, writes throttled to $IOPS IO/s and $BPS B/s"

target/release/weir-load contention --spool-classes lt --spool-dir "$MNT" --blkio-cgroup "$CG" "$@"
