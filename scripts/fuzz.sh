#!/usr/bin/env bash
# Fuzzes weir's parsers of untrusted input with cargo-fuzz (libFuzzer, on
# the nightly toolchain), each target for the given time.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Targets (fuzz/fuzz_targets/): mqtt_ingress, config, decode_batch,
# peer_messages, auth_files. Default: every target, 60 s each.
#
# The corpus of each target lives in fuzz/corpus/<target> (kept in the
# repository, minimised with `cargo fuzz cmin`); fuzz/seeds/<target> holds
# the hand-written starting inputs. A crash is written to
# fuzz/artifacts/<target>/; copy it into fuzz/regressions/<target>/, where
# `cargo test -p weir --test fuzz_regressions` replays it on every run.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(mqtt_ingress config decode_batch peer_messages auth_files)
fi

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked
fi

for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t"
  echo "fuzz: $t for ${secs}s"
  # -rss_limit_mb: a decoder that allocates without bound is a crash.
  cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=1024 -max_len=65536 -print_final_stats=1
done
