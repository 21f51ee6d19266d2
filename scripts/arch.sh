# Sourced by the packaging and image scripts: weir's three architectures
# (Debian names) and where each one's pieces are on this amd64 Debian host.

# The Rust target.
target_of() {
  case "$1" in
    amd64) echo x86_64-unknown-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu ;;
    armhf) echo armv7-unknown-linux-gnueabihf ;;
    *) echo "unknown architecture $1 (amd64, arm64, armhf)" >&2; exit 2 ;;
  esac
}

# The cargo profile the packages and images are built with: `release`,
# what ships, unless WEIR_PROFILE names another (e.g. `profiling`, for
# symbols).
profile=${WEIR_PROFILE:-release}

# The binary (the host's is built without --target).
bin_of() {
  if [ "$1" = amd64 ]; then
    echo "target/$profile/weir"
  else
    echo "target/$(target_of "$1")/$profile/weir"
  fi
}

# The GNU triplet: Debian's library directory name.
triplet_of() {
  case "$1" in
    amd64) echo x86_64-linux-gnu ;;
    arm64) echo aarch64-linux-gnu ;;
    armhf) echo arm-linux-gnueabihf ;;
    *) target_of "$1" ;;
  esac
}

# Where the architecture's C library is: the host's, or Debian's cross one.
libdir_of() {
  if [ "$1" = amd64 ]; then
    echo /lib/x86_64-linux-gnu
  else
    echo "/usr/$(triplet_of "$1")/lib"
  fi
}

# The OCI platform.
platform_of() {
  case "$1" in
    amd64) echo linux/amd64 ;;
    arm64) echo linux/arm64 ;;
    armhf) echo linux/arm/v7 ;;
    *) target_of "$1" ;;
  esac
}

# "<image bytes> <binary bytes>" of the image localhost/weir:<version>-<arch>.
image_sizes() {
  echo "$(podman image inspect --format '{{.Size}}' "localhost/weir:$1-$2") $(stat -c %s "$(bin_of "$2")")"
}
