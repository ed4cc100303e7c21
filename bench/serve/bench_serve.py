#!/usr/bin/env python3
"""Serving benchmark: load generator and latency/throughput metrics for thetaserve and peers.

Follows the method and metric definitions of vLLM's benchmarks/benchmark_serving.py:

  TTFT   time from sending the request to receiving the first output token
  TPOT   (e2e latency - TTFT) / (output tokens - 1), per request with more than one token
  ITL    gaps between consecutive streamed messages of a request (a message that carries
         several tokens counts once, as in vLLM)
  E2EL   time from sending the request to receiving its last message
  request throughput = completed requests / benchmark duration
  output throughput  = output tokens of completed requests / benchmark duration
  goodput            = completed requests meeting every given SLO / benchmark duration
  each latency: mean, median, std and the chosen percentiles (default p90, p99)

Backends:
  thetaserve  the project's gRPC streaming API (stubs generated from proto/ with grpcio-tools)
  openai      an OpenAI-compatible HTTP /v1/completions server with SSE streaming (llama.cpp's
              llama-server, llama-cpp-python's server, vLLM, ...)

Load: open loop with Poisson arrivals at --request-rate (inf = all requests at once; gamma
inter-arrival times when --burstiness != 1), optionally capped at --max-concurrency; or closed
loop with --concurrency C (= --request-rate inf --max-concurrency C: C requests in flight, a
new one starts when one finishes).

Prompts come from real text (data/*.txt, scripts/fetch-corpora.sh) cut to the sampled input
length with the model's own tokenizer, through thetaserve's Tokenize RPC (--tokenizer-addr), so
every backend receives the same prompt text with a known token count. A dataset can be saved
(--save-dataset) and replayed (--dataset) so that a peer gets byte-identical prompts. Without a
thetaserve server, --tokenizer words approximates tokens as 1.3 per whitespace-separated word.

Example:
  python3 bench/serve/bench_serve.py --backend thetaserve --addr 127.0.0.1:50051 \\
      --num-prompts 64 --concurrency 8 --input-len 128 --output-len 64 --ignore-eos \\
      --result-file out/c8.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import sys
from typing import List

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent

sys.path.insert(0, str(HERE))
import metrics as metrics_mod  # noqa: E402
# The parts live beside this file: bench_dataset (prompts), bench_clients (gRPC/HTTP backends),
# bench_load (load generation, run_benchmark). The names sweep.py and test_bench_serve.py use
# from this module are imported here and listed in __all__.
from bench_clients import GrpcTokenCounter  # noqa: E402
from bench_dataset import (BenchRequest, build_dataset, load_dataset,  # noqa: E402
                           make_prompt, parse_length_spec, save_dataset, word_token_counter)
from bench_load import parse_goodput, run_benchmark  # noqa: E402

__all__ = ["ROOT", "BenchRequest", "add_args", "build_dataset", "finalize_cfg", "format_summary",
           "get_dataset", "load_dataset", "main", "make_prompt", "parse_length_spec",
           "run_benchmark", "word_token_counter"]


def get_dataset(cfg) -> List[BenchRequest]:
    if cfg.dataset:
        reqs, meta = load_dataset(cfg.dataset)
        if cfg.num_prompts and cfg.num_prompts < len(reqs):
            reqs = reqs[:cfg.num_prompts]
        elif cfg.num_prompts and cfg.num_prompts > len(reqs):
            raise ValueError(f"--dataset {cfg.dataset} has {len(reqs)} prompts, "
                             f"--num-prompts asks {cfg.num_prompts}")
        return reqs
    corpus = cfg.corpus or sorted(glob.glob(str(ROOT / "data" / "*.txt")))
    if cfg.tokenizer == "words":
        counter, close = word_token_counter, (lambda: None)
    else:
        addr = cfg.tokenizer_addr or cfg.addr
        gc = GrpcTokenCounter(addr, api_key=cfg.api_key)
        counter, close = gc, gc.close
    try:
        reqs = build_dataset(cfg.num_prompts, cfg.input_len, cfg.output_len, corpus, counter,
                             cfg.seed, progress=not cfg.disable_tqdm,
                             shared_prefix_len=cfg.shared_prefix_len)
    finally:
        close()
    if cfg.save_dataset:
        save_dataset(cfg.save_dataset, reqs, {
            "tokenizer": cfg.tokenizer, "input_len": str(cfg.input_len),
            "output_len": str(cfg.output_len), "shared_prefix_len": cfg.shared_prefix_len,
            "seed": cfg.seed, "corpus": [os.path.basename(c) for c in corpus]})
    return reqs


def format_summary(r: dict) -> str:
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]

    def row(k, v):
        lines.append(f"{k:<44}{v}")
    row("Backend:", r["backend"])
    row("Label:", r.get("label") or "-")
    row("Request rate (req/s):", r["request_rate"])
    row("Max concurrency:", r["max_concurrency"] or "-")
    row("Successful requests:", r["completed"])
    row("Failed requests:", r["failed"])
    row("Benchmark duration (s):", f"{r['duration']:.2f}")
    row("Total input tokens:", r["total_input_tokens"])
    row("Total generated tokens:", r["total_output_tokens"])
    row("Request throughput (req/s):", f"{r['request_throughput']:.3f}")
    if r.get("request_goodput") is not None:
        row("Request goodput (req/s):", f"{r['request_goodput']:.3f}")
    row("Output token throughput (tok/s):", f"{r['output_throughput']:.2f}")
    row("Total token throughput (tok/s):", f"{r['total_token_throughput']:.2f}")
    for key, title in (("ttft", "Time to First Token"),
                       ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append("{s:{c}^60}".format(s=f" {title} ", c="-"))
        row(f"Mean {key.upper()} (ms):", f"{r[f'mean_{key}_ms']:.2f}")
        row(f"Median {key.upper()} (ms):", f"{r[f'median_{key}_ms']:.2f}")
        for p in r["percentiles"]:
            ps = metrics_mod.pct_name(p)
            row(f"P{ps} {key.upper()} (ms):", f"{r[f'p{ps}_{key}_ms']:.2f}")
    if r.get("prompt_len_mismatches"):
        lines.append(f"note: {r['prompt_len_mismatches']} requests where the server counted "
                     f"different prompt tokens than the dataset")
    lines.append("=" * 60)
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser, load_points=True):
    """The generator's flags; sweep.py passes load_points=False and takes lists instead."""
    p.add_argument("--backend", choices=["thetaserve", "openai"], default="thetaserve")
    p.add_argument("--addr", default="127.0.0.1:50051", help="thetaserve gRPC address")
    p.add_argument("--base-url", default="http://127.0.0.1:8080",
                   help="OpenAI-compatible server (openai backend)")
    p.add_argument("--model-name", default="default", help="'model' field (openai backend)")
    p.add_argument("--api-key", default=os.environ.get("THETASERVE_API_KEY"))
    p.add_argument("--extra-body", help="JSON merged into each /v1/completions body")
    # dataset
    p.add_argument("--dataset", help="replay a dataset saved with --save-dataset")
    p.add_argument("--save-dataset", help="write the prompts to this JSON file")
    p.add_argument("--corpus", nargs="*", help="text files (default: data/*.txt)")
    p.add_argument("--tokenizer", choices=["thetaserve", "words"], default="thetaserve",
                   help="count prompt tokens with thetaserve's Tokenize RPC or ~1.3 per word")
    p.add_argument("--tokenizer-addr", help="thetaserve address for Tokenize (default --addr)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", default="128", help="N or A:B (uniform)")
    p.add_argument("--output-len", default="64", help="N or A:B (uniform)")
    p.add_argument("--shared-prefix-len", type=int, default=0,
                   help="every prompt starts with the same text of about N tokens (then "
                        "--input-len tokens of its own): what a prefix cache can share")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly the output length (stopping.ignore_eos / ignore_eos)")
    p.add_argument("--min-tokens-eq-max", action="store_true",
                   help="openai backend: also send min_tokens = max_tokens (for servers without "
                        "ignore_eos, e.g. llama-cpp-python's)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--sampling-seed", type=int, help="per-request sampling seed base")
    # load
    if load_points:
        p.add_argument("--request-rate", type=float, default=float("inf"),
                       help="requests/s, Poisson arrivals (inf = all at once)")
        p.add_argument("--concurrency", type=int, default=None,
                       help="closed loop: C in flight (= --request-rate inf "
                            "--max-concurrency C)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="cap on requests in flight (open loop)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="uncounted warm-up requests")
    # output
    p.add_argument("--metric-percentiles", default="90,99")
    p.add_argument("--goodput", nargs="*",
                   help="SLOs in ms, e.g. --goodput ttft:1000 tpot:100 e2el:20000")
    p.add_argument("--result-file", help="write the JSON result here")
    p.add_argument("--save-detailed", action="store_true", help="per-request data in the JSON")
    p.add_argument("--label", default="")
    p.add_argument("--disable-tqdm", action="store_true")


def finalize_cfg(cfg):
    if cfg.concurrency:
        cfg.request_rate = float("inf")
        cfg.max_concurrency = cfg.concurrency
    if not hasattr(cfg, "extra_meta"):
        cfg.extra_meta = None
    return cfg


def check_cfg(p: argparse.ArgumentParser, cfg):
    """Refuses, as argparse does (usage, exit 2), what would end in a traceback or a silent
    surprise later: a rate or concurrency below 1 request, bad lengths or SLOs, a corpus that
    is not there, a result file that could not be written after the whole run."""
    if cfg.request_rate <= 0:
        p.error(f"--request-rate must be > 0 (inf: all at once), got {cfg.request_rate}")
    for flag, v in (("--concurrency", cfg.concurrency), ("--max-concurrency", cfg.max_concurrency),
                    ("--num-prompts", cfg.num_prompts)):
        if v is not None and v < 1:
            p.error(f"{flag} must be >= 1, got {v}")
    for flag, spec in (("--input-len", cfg.input_len), ("--output-len", cfg.output_len)):
        try:
            parse_length_spec(spec)
        except ValueError as e:
            p.error(f"{flag}: {e} (N or A:B)")
    try:
        parse_goodput(cfg.goodput)
    except ValueError as e:
        p.error(f"--goodput: {e} (NAME:MS, e.g. ttft:1000)")
    for path in cfg.corpus or []:
        if not os.path.isfile(path):
            p.error(f"--corpus {path}: no such file")
    if cfg.result_file:  # opened now, as it will be (access() says yes to root everywhere)
        path = pathlib.Path(cfg.result_file)
        existed = path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
        except OSError as e:
            p.error(f"--result-file {cfg.result_file} cannot be written: {e.strerror}")
        if not existed:
            path.unlink()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    cfg = finalize_cfg(p.parse_args(argv))
    check_cfg(p, cfg)
    reqs = get_dataset(cfg)
    result = run_benchmark(cfg, reqs)
    print(format_summary(result))
    errors = result.get("errors") or sorted(
        {r["error"] for r in result.get("requests", []) if r["error"]})[:10]
    if errors:
        print("errors: " + "; ".join(errors), file=sys.stderr)
    if cfg.result_file:
        pathlib.Path(cfg.result_file).parent.mkdir(parents=True, exist_ok=True)
        with open(cfg.result_file, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
