#!/usr/bin/env python3
"""Maximum sustainable request rate per configuration from open-loop sweep JSON files
(bench/serve/sweep.py output): issue 8's table (b).

    python3 bench/serve/sustainable.py RESULTS/thetaserve-dense.json RESULTS/thetaserve-sparse.json \\
        --slo-ttft-ms 188856 [--min-completed 0.9]

A point *meets the SLO* when its p99 TTFT is within --slo-ttft-ms and every request completed.
It is *sustained* when it also keeps up with its arrivals (ratio >= --min-completed): with a
handful of requests a point can pass the SLO on a queue that would keep growing, and this
second test catches that. The ratio is, when the sweep saved per-request data
(--save-detailed), the departure rate over the arrival rate, both between the first and the
last request ((n-1) / span of completions vs (n-1) / span of sends): a growing queue stretches
the completions. Without it, completed requests per second of the run over the offered rate,
which the drain of the last request biases downward at low rates (a stable server at 0.02
req/s with ~100 s requests scores ~0.9). A configuration's maximum rate is the highest offered
rate below which every point passes (a pass after a failure does not count). Prints a
Markdown table, each configuration's two maxima and their ratios against the first file's.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys

Maxima = collections.namedtuple(
    "Maxima", "config by_slo by_sustained best_completed slo_open_ended")


def points(run):
    pts = [p for p in run["points"] if p.get("request_rate") not in (None, "inf")]
    return sorted(pts, key=lambda p: float(p["request_rate"]))


def meets_slo(p, slo_ms):
    return p["failed"] == 0 and p["completed"] > 0 and p["p99_ttft_ms"] <= slo_ms


def keeps_up(p):
    """(ratio, how): departures over arrivals when per-request data exists, else completed over
    offered."""
    reqs = [r for r in p.get("requests", []) if r.get("success")]
    if len(reqs) >= 3:
        sends = sorted(r["start_time"] for r in reqs)
        dones = sorted(r["start_time"] + r["latency"] for r in reqs)
        if sends[-1] > sends[0] and dones[-1] > dones[0]:
            return (sends[-1] - sends[0]) / (dones[-1] - dones[0]), "departures/arrivals"
    return p["request_throughput"] / float(p["request_rate"]), "completed/offered"


def sustained(p, slo_ms, min_completed):
    return meets_slo(p, slo_ms) and keeps_up(p)[0] >= min_completed


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
        by_slo = max_rate(pts, lambda p: meets_slo(p, slo_ms))
        maxima.append(Maxima(
            config=run["config"], by_slo=by_slo,
            by_sustained=max_rate(pts, lambda p: sustained(p, slo_ms, min_completed)),
            best_completed=max((p["request_throughput"] for p in pts), default=None),
            # every point of the grid passed: the true maximum may lie beyond it
            slo_open_ended=bool(pts) and by_slo == float(pts[-1]["request_rate"])))
    return rows, maxima


def fmt_rate(r, open_ended=False):
    if r is None:
        return "below the grid's lowest"
    return f"≥ {r:g} req/s" if open_ended else f"{r:g} req/s"


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
    print(f"SLO: p99 TTFT <= {slo / 1000:.1f} s; sustained = meets the SLO and keeps up >= "
          f"{args.min_completed:.0%} (departures/arrivals, or completed/offered without "
          f"per-request data)\n")
    print("| config | offered req/s | completed req/s | median TTFT | p99 TTFT | within SLO | meets SLO "
          "| keeps up | sustained | median TPOT | server CPU ms per output token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg, p in rows:
        good = p.get("good_requests")
        within = f"{good}/{p['num_prompts']}" if good is not None else "—"
        cpu = p.get("server_cpu_ms_per_output_token")
        print(f"| {cfg} | {float(p['request_rate']):g} | {p['request_throughput']:.3f} | "
              f"{p['median_ttft_ms'] / 1000:.1f} s | {p['p99_ttft_ms'] / 1000:.1f} s | {within} | "
              f"{'yes' if meets_slo(p, slo) else 'no'} | "
              f"{keeps_up(p)[0]:.2f} ({keeps_up(p)[1]}) | "
              f"{'yes' if sustained(p, slo, args.min_completed) else 'no'} | "
              f"{p['median_tpot_ms']:.1f} ms | {f'{cpu:.0f}' if cpu else '—'} |")
    print()
    base = maxima[0]
    for m in maxima:
        best = f"{m.best_completed:.3f}" if m.best_completed is not None else "—"
        line = (f"{m.config}: max rate meeting the SLO {fmt_rate(m.by_slo, m.slo_open_ended)}; "
                f"sustained {fmt_rate(m.by_sustained)}; highest completed {best} req/s")
        if m.config != base.config:
            ratios = []
            if m.by_slo and base.by_slo:
                ratios.append(f"SLO only {m.by_slo / base.by_slo:.2f}×"
                              f"{' (at least)' if m.slo_open_ended else ''}")
            if m.by_sustained and base.by_sustained:
                ratios.append(f"sustained {m.by_sustained / base.by_sustained:.2f}×")
            if m.best_completed and base.best_completed:
                ratios.append(f"highest completed {m.best_completed / base.best_completed:.2f}×")
            line += f"; vs {base.config}: " + ", ".join(ratios)
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
