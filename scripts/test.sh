#!/usr/bin/env bash
# weir's whole test suite, on a fresh Debian machine: installs and starts
# Mosquitto and RabbitMQ (integration tests run against the real brokers),
# then runs every test of the workspace in every tier (docs/testing.md:
# the `services` and `root` features), including the criterion benches
# once each in test mode so they cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
cargo test --workspace --all-targets --all-features --locked
