#!/usr/bin/env python3
"""The link sweep's table: per link, weir's default config against the best
hand-tuned run (delivered records/s), and the default config's per-class p99
and late ls records. Usage: link-sweep-table.py DIR (scripts/link-sweep.sh's
--out)."""
import json
import pathlib
import sys


def load(path):
    try:
        j = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # weir-lab cluster writes a list of runs; the sweep makes one each.
    if isinstance(j, list):
        return j[0] if j else None
    return j


def key(cell):
    rate, rtt = cell.name.split("-")
    return (float(rate.removesuffix("mbit")), float(rtt.removesuffix("ms")))


def main():
    root = pathlib.Path(sys.argv[1])
    print("| link | RTT | default rec/s | best tuned rec/s (batch, window) | default / best | ls p99 ms | nm p99 ms | lt p99 ms | ls late % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cell in sorted((d for d in root.iterdir() if d.is_dir()), key=key):
        default = load(cell / "default" / "cluster.json")
        tuned = []
        for d in cell.iterdir():
            if d.name.startswith("tuned-"):
                r = load(d / "cluster.json")
                if r is not None:
                    tuned.append((r.get("delivered_rps", 0.0), d.name.removeprefix("tuned-")))
        rate, rtt = key(cell)
        if default is None:
            print(f"| {rate:g} Mbit/s | {rtt:g} ms | failed | | | | | | |")
            continue
        d_rps = default.get("delivered_rps", 0.0)
        best = max(tuned, default=(float("nan"), "-"))
        ratio = d_rps / best[0] if best[0] and best[0] == best[0] else float("nan")
        classes = default.get("classes", {})

        def p99(name):
            c = classes.get(name, {})
            v = c.get("latency_ms_p99")
            return "-" if v is None else f"{v:g}"

        late = classes.get("ls", {}).get("violation_pct", "-")
        print(
            f"| {rate:g} Mbit/s | {rtt:g} ms | {d_rps:,.0f} | {best[0]:,.0f} ({best[1]}) | {ratio:.2f} "
            f"| {p99('ls')} | {p99('nm')} | {p99('lt')} | {late} |"
        )


if __name__ == "__main__":
    main()
