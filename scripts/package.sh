#!/usr/bin/env bash
# Builds weir's Debian packages: amd64, arm64 (64-bit Raspberry Pi OS and
# other aarch64 boards) and armhf (32-bit Raspberry Pi OS), into
# target/debian/weir_<version>_<arch>.deb.
#
#   bash scripts/package.sh                 # all three
#   bash scripts/package.sh amd64 armhf     # some
#
# Built with the `release` profile (WEIR_PROFILE overrides it; see
# scripts/arch.sh).
#
# Each package holds /usr/bin/weir, /etc/weir/weir.toml (a conffile: the
# embedded defaults with the admin listener on loopback, so `weir top` and
# `weir reload` work), the systemd unit, the man pages and bash, zsh and
# fish completions. Installing does not start weir: set its egress in
# /etc/weir/weir.toml, then `systemctl enable --now weir`.
#
# Needs the cross compilers (installed here if missing, as in .ci/run) and
# dpkg-deb; nothing else (no cargo-deb).
set -euo pipefail
cd "$(dirname "$0")/.."

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64 armhf)

source scripts/arch.sh

need_apt=()
for a in "${arches[@]}"; do
  case "$a" in
    arm64) command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross) ;;
    armhf) command -v arm-linux-gnueabihf-gcc >/dev/null || need_apt+=(gcc-arm-linux-gnueabihf libc6-dev-armhf-cross) ;;
  esac
done
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The host build writes the man pages and completions (the same for every
# architecture) and is the amd64 package's binary.
cargo build --profile "$profile" --locked -p weir
host=$(bin_of amd64)
version=$("$host" --version | awk '{print $2}')
out=target/debian
mkdir -p "$out"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
mkdir -p "$gen/man" "$gen/completions"
"$host" manpages "$gen/man"
gzip -9n "$gen"/man/*.1
"$host" completions bash >"$gen/completions/weir"
"$host" completions zsh >"$gen/completions/_weir"
"$host" completions fish >"$gen/completions/weir.fish"
# The conffile: the documented defaults, with the admin listener on.
sed 's|^# listen = "127.0.0.1:9464"|listen = "127.0.0.1:9464"|' config/default.toml >"$gen/weir.toml"
grep -q '^listen = "127.0.0.1:9464"' "$gen/weir.toml" || {
  echo "package: config/default.toml no longer has the admin listen line this script turns on" >&2
  exit 1
}

# The cross builds in one cargo run: the host's build scripts and proc
# macros are built once, and the two targets' crates share the cores.
cross=()
for arch in "${arches[@]}"; do
  [ "$arch" = amd64 ] && continue
  target=$(target_of "$arch")
  rustup target add "$target" >/dev/null 2>&1 || true
  cross+=(--target "$target")
done
if [ ${#cross[@]} -gt 0 ]; then
  cargo build --profile "$profile" --locked "${cross[@]}" -p weir
fi

for arch in "${arches[@]}"; do
  bin=$(bin_of "$arch")
  root=$out/weir_${version}_${arch}
  rm -rf "$root"
  install -D -m 0755 "$bin" "$root/usr/bin/weir"
  install -D -m 0644 "$gen/weir.toml" "$root/etc/weir/weir.toml"
  install -D -m 0644 contrib/systemd/weir.service "$root/lib/systemd/system/weir.service"
  install -d "$root/usr/share/man/man1"
  install -m 0644 "$gen"/man/*.1.gz "$root/usr/share/man/man1/"
  install -D -m 0644 "$gen/completions/weir" "$root/usr/share/bash-completion/completions/weir"
  install -D -m 0644 "$gen/completions/_weir" "$root/usr/share/zsh/vendor-completions/_weir"
  install -D -m 0644 "$gen/completions/weir.fish" "$root/usr/share/fish/vendor_completions.d/weir.fish"
  install -D -m 0644 README.md "$root/usr/share/doc/weir/README.md"
  for d in operations security durability; do
    [ -f "docs/$d.md" ] && install -m 0644 "docs/$d.md" "$root/usr/share/doc/weir/"
  done
  install -d "$root/usr/share/doc/weir/examples"
  install -m 0644 config/*.toml "$root/usr/share/doc/weir/examples/"

  # The C library the binary was linked against: the newest GLIBC_ symbol
  # version it uses.
  glibc=$(readelf --version-info --wide "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  depends="libc6 (>= $glibc)"
  if readelf -d "$bin" | grep -q 'libgcc_s.so'; then
    depends="$depends, libgcc-s1"
  fi
  size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  mkdir -p "$root/DEBIAN"
  cat >"$root/DEBIAN/control" <<EOF
Package: weir
Version: $version
Architecture: $arch
Maintainer: weir developers <weir@example.invalid>
Installed-Size: $size
Depends: $depends
Section: net
Priority: optional
Homepage: https://example.invalid/weir
Description: latency-aware edge relay: MQTT and gRPC in, AMQP out
 weir sits between IoT devices and the cloud on an edge box. It accepts
 records over MQTT and gRPC, keeps them in per-class queues with latency
 bounds, drains them through token buckets set by the JANUS allocator,
 batches and compresses adaptively, and forwards to RabbitMQ with
 publisher confirms; overflow goes to idle peer weir nodes.
 .
 Installing does not start the service: set the egress in
 /etc/weir/weir.toml, then run systemctl enable --now weir.
EOF
  echo /etc/weir/weir.toml >"$root/DEBIAN/conffiles"
  cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
  if systemctl is-active --quiet weir.service; then
    # An upgrade: the new binary takes over, spooled records stay on disk.
    systemctl restart weir.service || true
  fi
fi
exit 0
EOF
  cat >"$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl disable --now weir.service >/dev/null 2>&1 || true
fi
exit 0
EOF
  cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$1" = purge ]; then
  # The state directory (DynamicUser keeps it under /var/lib/private).
  rm -rf /var/lib/private/weir /var/lib/weir
fi
exit 0
EOF
  chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/weir_${version}_${arch}.deb" >/dev/null
  rm -rf "$root"
  echo "package: $out/weir_${version}_${arch}.deb ($(du -h "$out/weir_${version}_${arch}.deb" | cut -f1), $depends)"
done
