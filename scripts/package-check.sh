#!/usr/bin/env bash
# Builds the Debian packages (scripts/package.sh), installs the amd64 one
# with dpkg -i and checks what it put in place, runs the arm64 and armhf
# binaries from their packages under qemu, then purges the package.
# Run by .ci/run, as root on a Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

source scripts/arch.sh
bash scripts/package.sh amd64 arm64 armhf
version=$("$(bin_of amd64)" --version | awk '{print $2}')
deb() { echo "target/debian/weir_${version}_$1.deb"; }

# amd64: installed for real.
dpkg -i "$(deb amd64)"
test "$(dpkg-query -W -f='${Status}' weir)" = "install ok installed"
/usr/bin/weir --version
/usr/bin/weir check-config /etc/weir/weir.toml
systemd-analyze verify /lib/systemd/system/weir.service
test -s /usr/share/man/man1/weir.1.gz
test -s /usr/share/man/man1/weir-run.1.gz
test -s /usr/share/bash-completion/completions/weir
test -s /usr/share/zsh/vendor-completions/_weir
test -s /usr/share/fish/vendor_completions.d/weir.fish
grep -qx /etc/weir/weir.toml /var/lib/dpkg/info/weir.conffiles
# A second install (an upgrade in place) keeps an edited conffile.
echo "# edited by the operator" >>/etc/weir/weir.toml
dpkg -i --force-confold "$(deb amd64)"
grep -q "edited by the operator" /etc/weir/weir.toml

# arm64 and armhf: the packaged binary runs and reads the packaged config.
for arch in arm64 armhf; do
  dir=$(mktemp -d)
  dpkg-deb -x "$(deb "$arch")" "$dir"
  test "$(dpkg-deb -f "$(deb "$arch")" Architecture)" = "$arch"
  case "$arch" in
    arm64) run=(qemu-aarch64-static -L /usr/aarch64-linux-gnu) ;;
    armhf) run=(qemu-arm-static -L /usr/arm-linux-gnueabihf) ;;
  esac
  "${run[@]}" "$dir/usr/bin/weir" --version
  "${run[@]}" "$dir/usr/bin/weir" check-config "$dir/etc/weir/weir.toml"
  for f in config/*.toml; do
    "${run[@]}" "$dir/usr/bin/weir" check-config "$f" >/dev/null
  done
  echo "package-check: $arch binary runs under qemu ($(du -h "$dir/usr/bin/weir" | cut -f1))"
  rm -rf "$dir"
done

dpkg --purge weir
test ! -e /usr/bin/weir
test ! -e /etc/weir/weir.toml
echo "package-check: amd64 installed, verified and purged; arm64 and armhf run under qemu"
