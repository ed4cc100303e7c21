"""The serving benchmark's load generation: arrivals (Poisson/gamma, or all at once), the
concurrency cap, the progress bar, the uncounted warm-up, and run_benchmark, which runs one load
point and builds the result dict with metrics.py. Split out of bench_serve.py, which re-exports
run_benchmark.
"""
from __future__ import annotations

import asyncio
import random
import sys
import time
from datetime import datetime, timezone
from typing import List

import metrics as metrics_mod
from bench_clients import RequestOutput, make_backend
from bench_dataset import BenchRequest


# ----------------------------------------------------------------------------------------------
# Load generation


class Progress:
    def __init__(self, total, disable=False, desc=""):
        self.total, self.n, self.disable = total, 0, disable
        self.bar = None
        self.t0 = time.time()
        self.desc = desc
        if disable:
            return
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def update(self):
        self.n += 1
        if self.disable:
            return
        if self.bar is not None:
            self.bar.update(1)
        else:
            width = 30
            done = int(width * self.n / max(1, self.total))
            sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] "
                             f"{self.n}/{self.total} {time.time() - self.t0:.1f}s")
            if self.n == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()


async def arrivals(reqs, rate: float, burstiness: float, rng: random.Random):
    """Yields requests; between them sleeps gamma(burstiness, 1/(rate*burstiness)) seconds
    (exponential, i.e. Poisson arrivals, when burstiness == 1)."""
    for i, r in enumerate(reqs):
        yield r
        if rate == float("inf") or i == len(reqs) - 1:
            continue
        theta = 1.0 / (rate * burstiness)
        await asyncio.sleep(rng.gammavariate(burstiness, theta))


async def run_load(backend, reqs, rate, burstiness, max_concurrency, seed, disable_tqdm,
                   desc=""):
    rng = random.Random(seed + 1)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    pbar = Progress(len(reqs), disable=disable_tqdm, desc=desc)
    outputs: List[RequestOutput] = [RequestOutput() for _ in reqs]
    t_origin = time.perf_counter()

    async def one(i, r):
        if sem is None:
            await backend.generate(r, outputs[i], t_origin)
        else:
            async with sem:
                await backend.generate(r, outputs[i], t_origin)
        pbar.update()

    tasks = []
    i = 0
    async for r in arrivals(reqs, rate, burstiness, rng):
        tasks.append(asyncio.create_task(one(i, r)))
        i += 1
    await asyncio.gather(*tasks)
    duration = time.perf_counter() - t_origin
    pbar.close()
    return outputs, duration


WARMUP_PROMPT = "Warm-up request of the serving benchmark. The capital of France is"


def parse_goodput(items):
    slos = {}
    for it in items or []:
        for part in it.split():
            k, v = part.split(":", 1)
            if k not in metrics_mod.SLO_KEYS:
                raise ValueError(f"goodput SLO {k!r}: one of {sorted(metrics_mod.SLO_KEYS)}")
            slos[k] = float(v)
    return slos


async def _run_async(cfg, reqs):
    backend = make_backend(cfg)
    try:
        server_info = {}
        try:
            server_info = await backend.info()
        except Exception as e:  # noqa: BLE001
            server_info = {"error": str(e)}
        # Warm-up: short requests, not counted (as vLLM's initial test run). Their prompt is
        # none of the measured ones, so a server with a prefix cache gains nothing from it.
        if cfg.warmup > 0:
            w = BenchRequest(prompt=WARMUP_PROMPT, prompt_len=0, output_len=4)
            for _ in range(cfg.warmup):
                deadline = time.time() + 300
                while True:
                    o = await backend.generate(w, RequestOutput(), time.perf_counter())
                    if o.success:
                        break
                    # still loading (thetaserve: UNAVAILABLE; HTTP servers: 503)
                    if time.time() < deadline and ("UNAVAILABLE" in o.error
                                                   or "HTTP 503" in o.error):
                        await asyncio.sleep(1)
                        continue
                    raise RuntimeError(f"warm-up request failed: {o.error}")
        desc = cfg.label or (f"c={cfg.max_concurrency}" if cfg.max_concurrency
                             else f"rate={cfg.request_rate}")
        outputs, duration = await run_load(backend, reqs, cfg.request_rate, cfg.burstiness,
                                           cfg.max_concurrency, cfg.seed, cfg.disable_tqdm,
                                           desc=desc)
        return outputs, duration, server_info
    finally:
        await backend.close()


def run_benchmark(cfg, reqs: List[BenchRequest]) -> dict:
    """Runs one load point and returns the result dict (vLLM-style keys)."""
    outputs, duration, server_info = asyncio.run(_run_async(cfg, reqs))
    percentiles = [float(p) for p in str(cfg.metric_percentiles).split(",") if p]
    slos = parse_goodput(cfg.goodput)
    summary = metrics_mod.calculate(outputs, duration, percentiles, slos)
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "label": cfg.label,
        "backend": cfg.backend,
        "target": cfg.addr if cfg.backend == "thetaserve" else cfg.base_url,
        "request_rate": "inf" if cfg.request_rate == float("inf") else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "num_prompts": len(reqs),
        "ignore_eos": cfg.ignore_eos,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "input_len_spec": cfg.input_len,
        "output_len_spec": cfg.output_len,
        "goodput_slos_ms": slos,
        "server_info": server_info,
        **summary,
    }
    if cfg.extra_meta:
        result.update(cfg.extra_meta)
    if cfg.save_detailed:
        result["requests"] = [
            {"prompt_len": o.prompt_len, "output_len": o.output_len, "success": o.success,
             "ttft": o.ttft, "latency": o.latency, "start_time": o.start_time,
             "itl": o.itl, "error": o.error, "finish_reason": o.finish_reason,
             "server_prompt_tokens": o.server_prompt_tokens, "server_ttft": o.server_ttft,
             "server_queue": o.server_queue, "preemptions": o.preemptions}
            for o in outputs]
    else:
        result["errors"] = sorted({o.error for o in outputs if o.error})[:10]
    return result
