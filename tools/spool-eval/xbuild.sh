#!/usr/bin/env bash
# Per-candidate build check: native + aarch64 cross build, dependency count and
# stripped binary size for each backend on its own (feature sets below).
# Usage: tools/spool-eval/xbuild.sh [OUT_DIR]
# Needs: rustup target aarch64-unknown-linux-gnu, aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu).
set -u
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/spool-eval-target}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}"
OUT="${1:-$CARGO_TARGET_DIR/xbuild}"
mkdir -p "$OUT"
# Every cargo call is serialised with other builds on this machine.
CARGO_BIN="$(type -P cargo)"
cargo() { flock /tmp/weir-cargo.lock "$CARGO_BIN" "$@"; }

AARCH=aarch64-unknown-linux-gnu
printf '| candidate | crates in tree (normal deps, aarch64) | added vs own log | native build | aarch64 build | stripped aarch64 binary | delta vs own log |\n'
printf '|---|---|---|---|---|---|---|\n'
base_deps=0
base_size=0
for feat in own fjall redb okaywal; do
  if [ "$feat" = own ]; then fl=(--no-default-features); else fl=(--no-default-features --features "$feat"); fi
  deps=$(cargo tree -q -e normal --prefix none "${fl[@]}" --target "$AARCH" 2>/dev/null | sed 's/ (\*)//' | sort -u | grep -c .)
  nat=FAIL; cross=FAIL; size=-
  if cargo build -q --release "${fl[@]}" >"$OUT/native-$feat.log" 2>&1; then nat=ok; fi
  if cargo build -q --release "${fl[@]}" --target "$AARCH" >"$OUT/aarch64-$feat.log" 2>&1; then
    cross=ok
    cp "$CARGO_TARGET_DIR/$AARCH/release/spool-eval" "$OUT/spool-eval-$feat-aarch64"
    aarch64-linux-gnu-strip -o "$OUT/spool-eval-$feat-aarch64.stripped" "$OUT/spool-eval-$feat-aarch64"
    size=$(stat -c %s "$OUT/spool-eval-$feat-aarch64.stripped")
    file "$OUT/spool-eval-$feat-aarch64" | grep -q aarch64 || cross="ok?(not aarch64)"
  fi
  if [ "$feat" = own ]; then base_deps=$deps; base_size=${size/-/0}; fi
  delta=-
  [ "$size" != - ] && delta=$(( (size - base_size) / 1024 ))KiB
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$feat" "$deps" "$((deps - base_deps))" "$nat" "$cross" \
    "$([ "$size" != - ] && echo "$((size / 1024)) KiB" || echo -)" "$delta"
done
