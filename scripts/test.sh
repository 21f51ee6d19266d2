#!/usr/bin/env bash
# weir's whole test suite, on a fresh Debian machine: installs and starts
# Mosquitto and RabbitMQ (integration tests run against the real brokers),
# then runs every test of the workspace in every tier (docs/testing.md:
# the `services` and `root` features), including the criterion benches
# once each in test mode so they cannot rot; then builds the container
# images and runs them with podman (scripts/image-check.sh; it says why
# where it cannot run).
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "test.sh: ${1} (at ${SECONDS} s)"; }
phase "brokers"
bash scripts/services.sh
phase "cargo test"
# Every tier; scripts/test-tiers.py counts the tests of the gated files
# and fails the run if any of those files ran none.
cargo test --workspace --all-targets --all-features --locked 2>&1 | python3 scripts/test-tiers.py
# The container images (release builds for amd64, arm64 and armhf; the
# Debian packages' check in .ci/run reuses them).
phase "container images"
bash scripts/image-check.sh
phase "done"
