#!/usr/bin/env python3
"""Throughput-vs-latency curves (PNG) from sweep JSON files (bench/serve/sweep.py output).

  python3 bench/serve/plot.py RESULTS/thetaserve-default.json RESULTS/llama.cpp-np64.json \\
      --out docs/plots/serving-short.png --title "short prompts"

One line per file (server + configuration), one marker per load point, labelled with its
concurrency (c8) or request rate (r2). Panels: output tokens/s against the load; median and p99
TTFT against output tokens/s; median TPOT against output tokens/s; the server's CPU time per
output token against the load (from /proc, when the sweep recorded it: on a shared machine it
moves less with the background load than wall-clock throughput does). Also prints a Markdown
table.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def load(paths):
    runs = []
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
        for f in files:
            with open(f) as fh:
                d = json.load(fh)
            if "points" not in d:
                continue
            runs.append((f, d))
    return runs


def run_name(d):
    server = d.get("server_name") or d.get("backend")
    cfg = d.get("config", "")
    return f"{server} ({cfg})" if cfg and cfg != "default" else server


def load_value(pt):
    if pt.get("max_concurrency") and pt.get("request_rate") in ("inf", float("inf")):
        return float(pt["max_concurrency"]), "concurrency"
    rr = pt.get("request_rate")
    return (float("inf") if rr == "inf" else float(rr)), "request rate (req/s)"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="sweep JSON files or result directories")
    p.add_argument("--out", required=True, help="PNG path")
    p.add_argument("--title", default="")
    p.add_argument("--slo-ttft-ms", type=float, help="draw a TTFT SLO line")
    args = p.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load(args.inputs)
    if not runs:
        print("no sweep JSON files", file=sys.stderr)
        return 1
    fig, grid = plt.subplots(2, 2, figsize=(13, 9))
    axes = grid.ravel()
    ax_load, ax_ttft, ax_tpot, ax_cpu = axes
    all_loads = set()
    xlabel = "load"
    rows = []
    for _, d in runs:
        name = run_name(d)
        pts = [pt for pt in d["points"] if pt.get("completed")]
        if not pts:
            continue
        pts.sort(key=lambda pt: load_value(pt)[0])
        loads = [load_value(pt)[0] for pt in pts]
        xlabel = load_value(pts[0])[1]
        tput = [pt["output_throughput"] for pt in pts]
        labels = [pt.get("label", "").split("/")[-1] for pt in pts]
        all_loads.update(x for x in loads if x != float("inf"))
        line, = ax_load.plot(loads, tput, marker="o", label=name)
        color = line.get_color()
        cpu = [pt.get("server_cpu_ms_per_output_token") for pt in pts]
        if all(c is not None for c in cpu):
            ax_cpu.plot(loads, cpu, marker="o", color=color, label=name)
        ax_ttft.plot(tput, [pt["median_ttft_ms"] for pt in pts], marker="o", color=color,
                     label=f"{name} median")
        if all("p99_ttft_ms" in pt for pt in pts):
            ax_ttft.plot(tput, [pt["p99_ttft_ms"] for pt in pts], marker="x", ls="--",
                         color=color, label=f"{name} p99")
        ax_tpot.plot(tput, [pt["median_tpot_ms"] for pt in pts], marker="o", color=color,
                     label=name)
        for x, y, lab in zip(tput, [pt["median_tpot_ms"] for pt in pts], labels):
            ax_tpot.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4),
                             fontsize=7, color=color)
        for x, y, lab in zip(tput, [pt["median_ttft_ms"] for pt in pts], labels):
            ax_ttft.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4),
                             fontsize=7, color=color)
        for pt, lab in zip(pts, labels):
            rows.append((name, lab, pt))

    ax_load.set_xlabel(xlabel)
    ax_load.set_ylabel("output tokens/s")
    for ax in (ax_load, ax_cpu):
        if xlabel == "concurrency":
            ax.set_xscale("log", base=2)
            ticks = sorted(all_loads)
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.set_xlabel(xlabel)
    ax_load.set_title("throughput vs load")
    ax_cpu.set_ylabel("server CPU ms per output token")
    ax_cpu.set_yscale("log")
    ax_cpu.set_title("server CPU time per output token")
    ax_ttft.set_xlabel("output tokens/s")
    ax_ttft.set_ylabel("TTFT (ms)")
    ax_ttft.set_yscale("log")
    ax_ttft.set_title("TTFT vs throughput")
    if args.slo_ttft_ms:
        ax_ttft.axhline(args.slo_ttft_ms, color="grey", ls=":", label="TTFT SLO")
    ax_tpot.set_xlabel("output tokens/s")
    ax_tpot.set_ylabel("median TPOT (ms)")
    ax_tpot.set_title("TPOT vs throughput")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}", file=sys.stderr)

    print("| server | load | out tok/s | req/s | median TTFT ms | p99 TTFT ms | "
          "median TPOT ms | median E2E ms | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, lab, pt in rows:
        print(f"| {name} | {lab} | {pt['output_throughput']:.1f} | "
              f"{pt['request_throughput']:.3f} | {pt['median_ttft_ms']:.0f} | "
              f"{pt.get('p99_ttft_ms', 0):.0f} | {pt['median_tpot_ms']:.1f} | "
              f"{pt['median_e2el_ms']:.0f} | {pt['completed']}/{pt['num_prompts']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
