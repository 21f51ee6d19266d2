#!/usr/bin/env python3
"""Reads `cargo test` output on stdin (passing it through) and reports how
many tests of each tier ran: the integration-test files that need the
`services` or `root` feature (`required-features` in the crates'
Cargo.toml, docs/testing.md). Exits 1 if a tier's tests did not all run,
so a run that silently left the brokers' tests out cannot pass. Also
lists the slowest test binaries, since CI must stay well under 30 minutes."""

import glob
import re
import sys
import tomllib

tiers = {}  # test target name -> its required features
for manifest in glob.glob("crates/*/Cargo.toml"):
    with open(manifest, "rb") as f:
        for t in tomllib.load(f).get("test", []):
            if t.get("required-features"):
                tiers[t["name"]] = tuple(t["required-features"])

ran = {}  # test target name -> tests passed
took = {}  # test binary -> seconds its tests ran
current = None
binary = None
for line in sys.stdin:
    sys.stdout.write(line)
    m = re.match(r"\s*Running (.+?) \((?:.*/)?([\w]+?)(?:-[0-9a-f]+)?\)", line)
    if m:
        binary = f"{m.group(2)}: {m.group(1)}"
    m = re.match(r"\s*Running tests/(\w+)\.rs", line)
    if m:
        current = m.group(1)
        continue
    m = re.match(r"test result: \w+\. (\d+) passed.*finished in ([\d.]+)s", line)
    if m and binary is not None:
        took[binary] = took.get(binary, 0.0) + float(m.group(2))
        binary = None
    if m and current is not None:
        ran[current] = ran.get(current, 0) + int(m.group(1))
        current = None
sys.stdout.flush()

slowest = sorted(took.items(), key=lambda kv: -kv[1])[:12]
print(f"test tiers: {sum(took.values()):.0f} s in test binaries; the slowest:")
for name, secs in slowest:
    print(f"  {secs:7.1f} s  {name}")

missing = sorted(n for n in tiers if not ran.get(n))
for tier in ("services", "root"):
    names = [n for n, f in tiers.items() if tier in f]
    tests = sum(ran.get(n, 0) for n in names)
    done = sum(1 for n in names if ran.get(n))
    print(f"test tiers: {tier}: {tests} tests passed in {done} of {len(names)} files")
if missing:
    print(f"test tiers: these gated test files ran no test: {', '.join(missing)}", file=sys.stderr)
    sys.exit(1)
