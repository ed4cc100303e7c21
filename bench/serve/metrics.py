"""Serving metrics with vLLM's definitions (benchmarks/benchmark_serving.py, calculate_metrics).

Pure Python (percentiles interpolate linearly between order statistics, as numpy.percentile's
default does), so the load generator needs no numpy.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

SLO_KEYS = {"ttft", "tpot", "e2el"}


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return 0.0
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    k = (len(xs) - 1) * p / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def std(values: Sequence[float]) -> float:
    # Population standard deviation, as numpy.std.
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def calculate(outputs, duration: float, percentiles: List[float],
              slos_ms: Dict[str, float]) -> dict:
    """outputs: objects with success, prompt_len, output_len, ttft, latency, itl (seconds)."""
    completed = 0
    total_input = 0
    output_lens = []
    ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], []
    mismatches = 0
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        n = o.output_len
        output_lens.append(n)
        total_input += o.prompt_len
        tpot = 0.0
        if n > 1:
            tpot = (o.latency - o.ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)  # requests with one token count as TPOT 0 for goodput (vLLM)
        itls.extend(o.itl)
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        completed += 1
        sp = getattr(o, "server_prompt_tokens", None)
        if sp is not None and sp != o.prompt_len:
            mismatches += 1

    good = None
    if slos_ms:
        cols, limits = [], []
        for key, col in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
            if key in slos_ms:
                cols.append(col)
                limits.append(slos_ms[key] / 1000.0)
        good = sum(1 for row in zip(*cols) if all(v <= s for v, s in zip(row, limits)))

    dur = max(duration, 1e-9)
    r = {
        "duration": duration,
        "completed": completed,
        "failed": len(outputs) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": sum(output_lens),
        "request_throughput": completed / dur,
        "request_goodput": (good / dur) if good is not None else None,
        "good_requests": good,
        "output_throughput": sum(output_lens) / dur,
        "total_token_throughput": (total_input + sum(output_lens)) / dur,
        "percentiles": percentiles,
        "prompt_len_mismatches": mismatches,
    }
    for key, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        r[f"mean_{key}_ms"] = mean(vals) * 1000
        r[f"median_{key}_ms"] = percentile(vals, 50) * 1000
        r[f"std_{key}_ms"] = std(vals) * 1000
        for p in percentiles:
            r[f"p{pct_name(p)}_{key}_ms"] = percentile(vals, p) * 1000
    return r
