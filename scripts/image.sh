#!/usr/bin/env bash
# Builds weir's container images: one per architecture (amd64, arm64,
# armhf) from the release binaries the Debian packages ship
# (scripts/package.sh), and a manifest list over them.
#
#   bash scripts/image.sh                 # all three
#   bash scripts/image.sh amd64           # some
#
# In local container storage (podman's, as root):
#   localhost/weir:<version>-<arch>       each architecture's image
#   localhost/weir:<version>              the host's architecture's
# In target/image/:
#   weir_<version>_<arch>.tar             docker-archive: `podman load -i`
#                                         or `docker load -i` on a device
#   weir_<version>.oci.tar                the manifest list with every
#                                         image, an OCI archive for
#                                         `skopeo copy --all` to a registry
#
# The image (contrib/container/Containerfile) is FROM scratch: the binary,
# the C library it links, the config, the CA bundle; docs/container.md
# says what is in it and how to run it. Needs root on Debian (podman is
# installed if missing); no registry, no base image, no emulation.
set -euo pipefail
cd "$(dirname "$0")/.."

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64 armhf)
source scripts/arch.sh
for a in "${arches[@]}"; do
  target_of "$a" >/dev/null
done

if ! command -v podman >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi

bash scripts/package.sh "${arches[@]}"
version=$("$(bin_of amd64)" --version | awk '{print $2}')
source_url=$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Reproducible: the image's dates are the commit's.
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
out=target/image
mkdir -p "$out"

# The image's config: the documented defaults (every key, with its
# comment) with the listeners on all addresses of the container's network,
# so that a port mapping reaches them, anonymous clients allowed where
# that is so (stated, as weir requires of a reachable listener), the file
# egress on the volume, and a drain that ends within a runtime's stop
# grace period (docker and podman: 10 s).
container_config() {
  sed \
    -e '/^\[ingress\.mqtt\]$/,/^\[ingress\.grpc\]$/ s|^listen = "127.0.0.1:1883"$|listen = "0.0.0.0:1883"|' \
    -e '/^\[ingress\.mqtt\]$/,/^\[ingress\.grpc\]$/ s|^# allow_anonymous = false$|allow_anonymous = true       # the container image: set password_file instead (docs/container.md)|' \
    -e '/^\[ingress\.grpc\]$/,/^\[egress\]$/ s|^listen = "127.0.0.1:50051"$|listen = "0.0.0.0:50051"|' \
    -e '/^\[ingress\.grpc\]$/,/^\[egress\]$/ s|^# allow_anonymous = false$|allow_anonymous = true       # the container image: see docs/container.md|' \
    -e 's|^drain_timeout = "30s"$|drain_timeout = "8s"          # the container image: within a 10 s stop|' \
    -e '/^\[egress\.file\]$/,/^$/ s|^dir = "weir-out"$|dir = "/var/lib/weir/out"|' \
    -e 's|^# listen = "127.0.0.1:9464"$|listen = "0.0.0.0:9464"|' \
    config/default.toml
}
container_config >"$out/weir.toml"
for line in 'listen = "0.0.0.0:1883"' 'listen = "0.0.0.0:50051"' 'listen = "0.0.0.0:9464"' \
  'dir = "/var/lib/weir/out"' 'drain_timeout = "8s"'; do
  grep -q "^$line" "$out/weir.toml" || {
    echo "image: config/default.toml no longer has the line this script turns into: $line" >&2
    exit 1
  }
done
test "$(grep -c '^allow_anonymous = true' "$out/weir.toml")" = 2 || {
  echo "image: config/default.toml no longer has the two allow_anonymous lines this script states" >&2
  exit 1
}

# Copies the shared libraries `elf` needs (and theirs) from `from` into
# `into`.
copy_needed() {
  local elf=$1 from=$2 into=$3 lib
  for lib in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -e "$into/$lib" ] && continue
    [ -e "$from/$lib" ] || {
      echo "image: $elf needs $lib, not in $from" >&2
      exit 1
    }
    cp -L "$from/$lib" "$into/$lib"
    copy_needed "$into/$lib" "$from" "$into"
  done
}

images=()
for arch in "${arches[@]}"; do
  ctx=$out/$arch
  rm -rf "$ctx"
  mkdir -p "$ctx/rootfs/usr/bin" "$ctx/rootfs/etc/weir" "$ctx/rootfs/etc/ssl/certs" \
    "$ctx/data/spool" "$ctx/data/out"
  # The binary the package holds (scripts/package.sh built it there).
  bin=$(bin_of "$arch")
  install -m 0755 "$bin" "$ctx/rootfs/usr/bin/weir"
  install -m 0644 "$out/weir.toml" "$ctx/rootfs/etc/weir/weir.toml"
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nweir:x:65532:65532:weir:/var/lib/weir:/sbin/nologin\n' \
    >"$ctx/rootfs/etc/passwd"
  printf 'root:x:0:\nweir:x:65532:\n' >"$ctx/rootfs/etc/group"
  # The loader where the binary asks for it, the libraries where Debian's
  # loader looks (/lib/<triplet>).
  interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
  libs=$ctx/rootfs/lib/$(triplet_of "$arch")
  mkdir -p "$libs" "$ctx/rootfs$(dirname "$interp")"
  cp -L "$(libdir_of "$arch")/$(basename "$interp")" "$ctx/rootfs$interp"
  copy_needed "$bin" "$(libdir_of "$arch")" "$libs"
  # The loader is loaded already; a second copy would only take space.
  rm -f "$libs/$(basename "$interp")"

  tag=localhost/weir:$version-$arch
  # A rebuild replaces the image rather than leaving the old one dangling.
  for old in "$tag" "localhost/weir:$version"; do
    podman image exists "$old" && podman rmi "$old" >/dev/null 2>&1 || true
  done
  podman build --quiet --no-cache --layers=false --platform "$(platform_of "$arch")" --format docker \
    --timestamp "$epoch" \
    --build-arg VERSION="$version" --build-arg REVISION="$revision" \
    --build-arg SOURCE="$source_url" --build-arg CREATED="$created" \
    -f contrib/container/Containerfile -t "$tag" "$ctx" >/dev/null
  rm -f "$out/weir_${version}_${arch}.tar"
  podman save --quiet --format docker-archive -o "$out/weir_${version}_${arch}.tar" "$tag"
  read -r size binsize <<<"$(image_sizes "$version" "$arch")"
  echo "image: $tag: $((size / 1024)) KiB, the binary $((binsize / 1024)) KiB ($(awk "BEGIN{printf \"%.2f\", $size/$binsize}")x)"
  images+=("$tag")
done

# The manifest list goes to the OCI archive only: kept in podman 4's
# local storage it breaks `podman images` (containers/podman#19757).
list=localhost/weir:$version-list
podman manifest exists "$list" && podman manifest rm "$list" >/dev/null
podman manifest create "$list" >/dev/null
for tag in "${images[@]}"; do
  # The labels again as OCI annotations on the list's entries.
  podman manifest add "$list" "containers-storage:$tag" \
    --annotation "org.opencontainers.image.version=$version" \
    --annotation "org.opencontainers.image.revision=$revision" \
    --annotation "org.opencontainers.image.source=$source_url" >/dev/null
done
rm -f "$out/weir_${version}.oci.tar"
podman manifest push --quiet --all "$list" "oci-archive:$out/weir_${version}.oci.tar"
podman manifest rm "$list" >/dev/null
# localhost/weir:<version> is this host's own architecture.
host_arch=$(dpkg --print-architecture)
if podman image exists "localhost/weir:$version-$host_arch"; then
  podman tag "localhost/weir:$version-$host_arch" "localhost/weir:$version"
fi
echo "image: ${images[*]}; localhost/weir:$version is $host_arch; archives in $out/"
