#!/usr/bin/env python3
"""Renders contrib/grafana/weir.json's panels to one PNG from a real
Prometheus: every target's PromQL is run through Prometheus's query_range
API over the window given, exactly as Grafana would run it ($instance as
all instances, $__rate_interval as --rate-interval), and drawn with
matplotlib. Used by scripts/dashboard-demo.sh for docs/img/dashboard.png;
it also proves the dashboard's queries return data from weir's metrics.

  python3 scripts/render-dashboard.py --prometheus http://127.0.0.1:19090 \\
      --start 1764000000 --end 1764000240 --out docs/img/dashboard.png

Prints, per panel, how many series came back; exits 1 if a panel listed in
--require got none.
"""
import argparse
import json
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

UNIT_SCALE = {"s": (1e3, "ms"), "Bps": (1e-3, "kB/s"), "bytes": (1e-6, "MB"),
              "percentunit": (100, "%"), "reqps": (1, "/s"), "ops": (1, "/s"), "short": (1, "")}


def query_range(base, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--dashboard", default="contrib/grafana/weir.json")
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--step", default="2s")
    ap.add_argument("--rate-interval", default="15s")
    ap.add_argument("--out", default="docs/img/dashboard.png")
    ap.add_argument("--instance", default=".*", help="regex for $instance (the weir node(s) shown)")
    ap.add_argument("--require", default="", help="comma-separated panel titles that must have data")
    a = ap.parse_args()

    dash = json.load(open(a.dashboard))
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(18, 3.1 * rows), squeeze=False)
    empty = []
    for ax, p in zip(axes.flat, panels):
        unit = p["fieldConfig"]["defaults"].get("unit", "short")
        scale, label = UNIT_SCALE.get(unit, (1, unit))
        series = 0
        for t in p["targets"]:
            expr = t["expr"].replace("$__rate_interval", a.rate_interval).replace(
                'instance=~"$instance"', f'instance=~"{a.instance}"')
            for r in query_range(a.prometheus, expr, a.start, a.end, a.step):
                xs = [float(v[0]) - a.start for v in r["values"]]
                ys = [float(v[1]) * scale for v in r["values"]]
                name = legend(t.get("legendFormat", ""), r["metric"])
                style = "--" if name.endswith("bound") else "-"
                if p["type"] == "stat":
                    ax.text(0.5, 0.5, f"{ys[-1]:g}", ha="center", va="center", fontsize=40,
                            transform=ax.transAxes)
                    ax.set_xticks([])
                    ax.set_yticks([])
                else:
                    ax.plot(xs, ys, style, linewidth=1, label=name)
                series += 1
        ax.set_title(p["title"], fontsize=10)
        if p["type"] != "stat":
            ax.set_ylabel(label, fontsize=8)
            ax.set_xlabel("s", fontsize=8)
            ax.tick_params(labelsize=7)
            if series:
                ax.legend(fontsize=6, loc="upper left")
        print(f"{p['title']}: {series} series")
        if series == 0:
            empty.append(p["title"])
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dash['title']}: {a.dashboard}, instance {a.instance}, from Prometheus "
                 f"({a.end - a.start:.0f} s)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(a.out, dpi=80)
    print(f"wrote {a.out}")
    required = [t for t in a.require.split(",") if t]
    missing = [t for t in required if t in empty]
    if missing:
        print(f"panels without data: {missing}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
