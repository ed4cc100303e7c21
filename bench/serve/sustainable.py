#!/usr/bin/env python3
"""Maximum sustainable request rate per configuration from open-loop sweep JSON files
(bench/serve/sweep.py output): issue 8's table (b).

    python3 bench/serve/sustainable.py RESULTS/thetaserve-dense.json RESULTS/thetaserve-sparse.json \\
        --slo-ttft-ms 188856 [--min-completed 0.9]

A point *meets the SLO* when its p99 TTFT is within --slo-ttft-ms and every request completed.
It is *sustained* when it also completed at least --min-completed of the offered rate (requests
completed per second of the run ÷ offered req/s): with a handful of requests a point can pass
the SLO on a queue that would keep growing, and this second test catches that. A
configuration's maximum sustainable rate is the highest offered rate below which every point
passes (a later pass after a failure does not count). Prints a Markdown table, each
configuration's two maxima, and their ratios against the first file's configuration.
"""
from __future__ import annotations

import argparse
import json
import sys


def points(run):
    pts = [p for p in run["points"] if p.get("request_rate") not in (None, "inf")]
    return sorted(pts, key=lambda p: float(p["request_rate"]))


def meets_slo(p, slo_ms):
    return p["failed"] == 0 and p["completed"] > 0 and p["p99_ttft_ms"] <= slo_ms


def sustained(p, slo_ms, min_completed):
    return meets_slo(p, slo_ms) and p["request_throughput"] >= min_completed * float(p["request_rate"])


def max_rate(pts, ok):
    """Highest offered rate such that it and every lower point pass; None if the first fails."""
    best = None
    for p in pts:
        if not ok(p):
            break
        best = float(p["request_rate"])
    return best


def summarize(runs, slo_ms, min_completed):
    rows, maxima = [], []
    for run in runs:
        pts = points(run)
        for p in pts:
            rows.append((run["config"], p))
        maxima.append((run["config"],
                       max_rate(pts, lambda p: meets_slo(p, slo_ms)),
                       max_rate(pts, lambda p: sustained(p, slo_ms, min_completed)),
                       max(pts, key=lambda p: p["request_throughput"])["request_throughput"] if pts else None,
                       bool(pts) and meets_slo(pts[-1], slo_ms)))
    return rows, maxima


def fmt_rate(r, open_ended=False):
    if r is None:
        return "below the grid"
    return f"≥ {r:g}" if open_ended else f"{r:g}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="sweep JSON files, the baseline first")
    ap.add_argument("--slo-ttft-ms", type=float, required=True)
    ap.add_argument("--min-completed", type=float, default=0.9)
    args = ap.parse_args(argv)
    runs = []
    for f in args.inputs:
        with open(f) as fh:
            runs.append(json.load(fh))
    rows, maxima = summarize(runs, args.slo_ttft_ms, args.min_completed)
    slo = args.slo_ttft_ms
    print(f"SLO: p99 TTFT <= {slo / 1000:.1f} s; sustained = meets the SLO and completed >= "
          f"{args.min_completed:.0%} of the offered rate\n")
    print("| config | offered req/s | completed req/s | median TTFT | p99 TTFT | within SLO | meets SLO "
          "| sustained | median TPOT | server CPU ms per output token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg, p in rows:
        good = p.get("good_requests")
        within = f"{good}/{p['num_prompts']}" if good is not None else "—"
        cpu = p.get("server_cpu_ms_per_output_token")
        print(f"| {cfg} | {float(p['request_rate']):g} | {p['request_throughput']:.3f} | "
              f"{p['median_ttft_ms'] / 1000:.1f} s | {p['p99_ttft_ms'] / 1000:.1f} s | {within} | "
              f"{'yes' if meets_slo(p, slo) else 'no'} | "
              f"{'yes' if sustained(p, slo, args.min_completed) else 'no'} | "
              f"{p['median_tpot_ms']:.1f} ms | {f'{cpu:.0f}' if cpu else '—'} |")
    print()
    base = maxima[0]
    for cfg, by_slo, by_sustained, best_tput, last_passes in maxima:
        line = (f"{cfg}: max rate meeting the SLO {fmt_rate(by_slo, last_passes)} req/s; "
                f"sustained {fmt_rate(by_sustained)} req/s; highest completed {best_tput:.3f} req/s")
        if cfg != base[0]:
            ratios = []
            if by_slo and base[1]:
                ratios.append(f"SLO only {by_slo / base[1]:.2f}×{' (at least)' if last_passes else ''}")
            if by_sustained and base[2]:
                ratios.append(f"sustained {by_sustained / base[2]:.2f}×")
            if best_tput and base[3]:
                ratios.append(f"saturated throughput {best_tput / base[3]:.2f}×")
            line += f"; vs {base[0]}: " + ", ".join(ratios)
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
