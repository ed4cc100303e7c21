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
import asyncio
import glob
import json
import math
import os
import pathlib
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Callable, List, Optional

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROTO_ROOT = ROOT / "proto"
GEN = pathlib.Path(os.environ.get("BENCH_SERVE_GEN", ROOT / "build" / "bench-serve-gen"))

sys.path.insert(0, str(HERE))
import metrics as metrics_mod  # noqa: E402


# ----------------------------------------------------------------------------------------------
# gRPC stubs


def ensure_stubs():
    """Generates Python stubs from proto/ into GEN (git-ignored) when missing or stale."""
    target = GEN / "thetaserve" / "v1" / "generation_pb2_grpc.py"
    proto = PROTO_ROOT / "thetaserve" / "v1" / "generation.proto"
    if not target.exists() or target.stat().st_mtime < proto.stat().st_mtime:
        GEN.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
             f"--python_out={GEN}", f"--grpc_python_out={GEN}", str(proto)],
            check=True)
    if str(GEN) not in sys.path:
        sys.path.insert(0, str(GEN))
    from thetaserve.v1 import generation_pb2, generation_pb2_grpc  # noqa: F401
    return generation_pb2, generation_pb2_grpc


# ----------------------------------------------------------------------------------------------
# Dataset


@dataclass
class BenchRequest:
    prompt: str
    prompt_len: int      # tokens, as the server's tokenizer counts them (or the word estimate)
    output_len: int      # max_tokens
    source: str = ""     # corpus file and word offset, for reproducibility


def parse_length_spec(spec: str):
    """'128' (fixed) or 'A:B' (uniform integers in [A, B])."""
    spec = str(spec).strip()
    if ":" in spec:
        a, b = (int(x) for x in spec.split(":", 1))
        if a < 1 or b < a:
            raise ValueError(f"length range {spec!r}: need 1 <= A <= B")
        return lambda rng: rng.randint(a, b)
    n = int(spec)
    if n < 1:
        raise ValueError(f"length {spec!r}: need >= 1")
    return lambda rng: n


def load_corpus(paths: List[str]):
    corpora = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            words = f.read().split()
        if len(words) < 1000:
            raise ValueError(f"corpus {p} has only {len(words)} words")
        corpora.append((os.path.basename(p), words))
    if not corpora:
        raise ValueError("no corpus files (run scripts/fetch-corpora.sh)")
    return corpora


class GrpcTokenCounter:
    """Counts tokens with thetaserve's Tokenize RPC (the model's own tokenizer)."""

    def __init__(self, addr: str, api_key: Optional[str] = None, timeout: float = 120.0):
        pb, pb_grpc = ensure_stubs()
        import grpc
        self.pb = pb
        self.channel = grpc.insecure_channel(addr)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.metadata = [("authorization", f"Bearer {api_key}")] if api_key else None
        self.timeout = timeout
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        resp = self.stub.Tokenize(self.pb.TokenizeRequest(text=text),
                                  metadata=self.metadata, timeout=self.timeout)
        return len(resp.ids)

    def close(self):
        self.channel.close()


def word_token_counter(text: str) -> int:
    # Rough: English prose is about 1.3 BPE tokens per word; +1 for a BOS.
    return int(round(len(text.split()) * 1.3)) + 1


def make_prompt(words: List[str], start: int, target: int, count: Callable[[str], int],
                ratio_state: list):
    """Largest prefix (in words) of words[start:] whose token count is <= target."""
    ratio = ratio_state[0]
    cache = {}

    def c(w):
        if w not in cache:
            cache[w] = count(" ".join(words[start:start + w]))
        return cache[w]

    lo, lo_count, hi = 0, 0, None
    w = max(1, int(target / ratio))
    for _ in range(40):
        w = min(w, len(words) - start)
        n = c(w)
        if n <= target:
            lo, lo_count = w, n
            if n == target or w == len(words) - start:
                break
        else:
            hi = w
        if hi is not None and hi - lo <= 1:
            break
        if hi is None:
            w = lo + max(1, int(math.ceil((target - n) / ratio)))
        else:
            w = (lo + hi) // 2
    if lo == 0:
        lo = 1
        lo_count = c(1)
    if lo_count > 1:
        ratio_state[0] = 0.8 * ratio + 0.2 * (lo_count / lo)
    return " ".join(words[start:start + lo]), lo_count


def build_dataset(num: int, input_len: str, output_len: str, corpus_paths: List[str],
                  count: Callable[[str], int], seed: int, progress=True,
                  shared_prefix_len: int = 0) -> List[BenchRequest]:
    """`num` prompts of input_len tokens cut from the corpora at random places; with
    shared_prefix_len, every prompt starts with the same text of about that many tokens (a
    system prompt, as vLLM's --random-prefix-len) and input_len is the part after it."""
    rng = random.Random(seed)
    in_dist, out_dist = parse_length_spec(input_len), parse_length_spec(output_len)
    corpora = load_corpus(corpus_paths)
    ratio_state = [1.3]
    prefix = ""
    if shared_prefix_len > 0:
        name, words = corpora[rng.randrange(len(corpora))]
        start = rng.randrange(0, max(1, len(words) - 4 * shared_prefix_len - 10))
        prefix, _ = make_prompt(words, start, shared_prefix_len, count, ratio_state)
        prefix += " "
    out = []
    t0 = time.time()
    for i in range(num):
        name, words = corpora[rng.randrange(len(corpora))]
        target_in = in_dist(rng)
        target_out = out_dist(rng)
        start = rng.randrange(0, max(1, len(words) - 4 * target_in - 10))
        text, n = make_prompt(words, start, target_in, count, ratio_state)
        if prefix:
            text = prefix + text
            n = count(text)
        out.append(BenchRequest(prompt=text, prompt_len=n, output_len=target_out,
                                source=f"{name}@{start}"))
        if progress and (i + 1) % 50 == 0:
            print(f"  dataset: {i + 1}/{num} prompts ({time.time() - t0:.1f} s)", file=sys.stderr)
    return out


def save_dataset(path: str, reqs: List[BenchRequest], meta: dict):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "requests": [asdict(r) for r in reqs]}, f)


def load_dataset(path: str):
    with open(path) as f:
        d = json.load(f)
    return [BenchRequest(**r) for r in d["requests"]], d.get("meta", {})


# ----------------------------------------------------------------------------------------------
# Backends: each streams one request and fills a RequestOutput


@dataclass
class RequestOutput:
    prompt_len: int = 0
    output_len: int = 0           # output tokens received
    max_tokens: int = 0
    success: bool = False
    ttft: float = 0.0             # seconds
    latency: float = 0.0          # seconds, e2e
    itl: List[float] = field(default_factory=list)
    start_time: float = 0.0       # seconds since the benchmark started
    error: str = ""
    finish_reason: str = ""
    server_prompt_tokens: Optional[int] = None
    server_ttft: Optional[float] = None
    server_queue: Optional[float] = None
    preemptions: Optional[int] = None


class ThetaserveBackend:
    name = "thetaserve"

    def __init__(self, addr, api_key=None, temperature=0.0, ignore_eos=False, seed=None,
                 timeout=3600.0):
        self.pb, pb_grpc = ensure_stubs()
        import grpc
        import grpc.aio
        self.grpc = grpc
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.aio.insecure_channel(addr, options=opts)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.metadata = [("authorization", f"Bearer {api_key}")] if api_key else None
        self.temperature, self.ignore_eos, self.seed = temperature, ignore_eos, seed
        self.timeout = timeout
        self.counter = 0

    async def info(self):
        mi = await self.stub.GetModelInfo(self.pb.GetModelInfoRequest(), metadata=self.metadata,
                                          timeout=30)
        st = await self.stub.GetServerStatus(self.pb.GetServerStatusRequest(),
                                             metadata=self.metadata, timeout=30)
        from google.protobuf.json_format import MessageToDict
        return {"model_info": MessageToDict(mi), "server_status": MessageToDict(st)}

    async def generate(self, req: BenchRequest, out: RequestOutput, t_origin: float):
        pb = self.pb
        self.counter += 1
        sampling = pb.SamplingParams(temperature=self.temperature)
        if self.seed is not None:
            sampling.seed = self.seed + self.counter
        request = pb.GenerateRequest(
            request_id=f"bench-{os.getpid()}-{self.counter}", prompt=req.prompt,
            sampling=sampling,
            stopping=pb.StoppingCriteria(max_tokens=req.output_len, ignore_eos=self.ignore_eos))
        out.prompt_len, out.max_tokens = req.prompt_len, req.output_len
        st = time.perf_counter()
        out.start_time = st - t_origin
        last = st
        ttft = 0.0
        try:
            call = self.stub.Generate(request, metadata=self.metadata, timeout=self.timeout)
            async for resp in call:
                kind = resp.WhichOneof("kind")
                now = time.perf_counter()
                if kind == "chunk":
                    n = len(resp.chunk.token_ids)
                    if n == 0:
                        continue
                    if out.output_len == 0:
                        ttft = now - st
                        out.ttft = ttft
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.output_len += n
                elif kind == "complete":
                    c = resp.complete
                    out.finish_reason = pb.FinishReason.Name(c.finish_reason)
                    out.server_prompt_tokens = c.usage.prompt_tokens
                    out.server_ttft = c.timings.time_to_first_token_seconds
                    out.server_queue = c.timings.queue_seconds
                    out.preemptions = c.preemptions
                    if c.usage.completion_tokens != out.output_len:
                        out.output_len = max(out.output_len, c.usage.completion_tokens)
            out.latency = last - st
            out.success = out.output_len > 0 and out.finish_reason not in (
                "FINISH_REASON_ERROR", "FINISH_REASON_CANCELLED")
            if not out.success and not out.error:
                out.error = f"finish {out.finish_reason or 'missing'}, {out.output_len} tokens"
        except self.grpc.aio.AioRpcError as e:
            out.success = False
            out.error = f"{e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001
            out.success = False
            out.error = f"{type(e).__name__}: {e}"
        return out

    async def close(self):
        await self.channel.close()


class OpenAICompletionsBackend:
    """POST {base_url}/v1/completions with stream=true; parses SSE 'data:' lines."""
    name = "openai"

    def __init__(self, base_url, model="default", api_key=None, temperature=0.0,
                 ignore_eos=False, seed=None, extra_body=None, min_tokens_eq_max=False,
                 timeout=3600.0):
        import aiohttp
        self.aiohttp = aiohttp
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.temperature, self.ignore_eos, self.seed = temperature, ignore_eos, seed
        self.extra_body = extra_body or {}
        self.min_tokens_eq_max = min_tokens_eq_max
        # A new connection per request (as vLLM's client, which opens a session per request):
        # reusing keep-alive connections across requests races with servers that close idle
        # or much-used connections (cpp-httplib in llama-server) and fails requests.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=timeout))
        self.counter = 0

    async def info(self):
        d = {}
        for path in ("/v1/models", "/props"):
            try:
                async with self.session.get(self.base_url + path) as r:
                    if r.status == 200:
                        d[path] = await r.json(content_type=None)
            except Exception:  # noqa: BLE001
                pass
        # llama-server's /props carries a large chat template; keep the useful bits.
        props = d.get("/props")
        if isinstance(props, dict):
            keep = {k: props[k] for k in ("total_slots", "build_info", "model_path",
                                          "default_generation_settings") if k in props}
            dgs = keep.get("default_generation_settings")
            if isinstance(dgs, dict):
                keep["default_generation_settings"] = {
                    k: dgs[k] for k in ("n_ctx", "params") if k in dgs}
                p = keep["default_generation_settings"].get("params")
                if isinstance(p, dict):
                    keep["default_generation_settings"]["params"] = {
                        k: v for k, v in p.items() if not isinstance(v, (list, dict))}
            d["/props"] = keep
        return d

    async def generate(self, req: BenchRequest, out: RequestOutput, t_origin: float):
        self.counter += 1
        body = {"model": self.model, "prompt": req.prompt, "max_tokens": req.output_len,
                "temperature": self.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.min_tokens_eq_max:
            body["min_tokens"] = req.output_len
        if self.seed is not None:
            body["seed"] = self.seed + self.counter
        body.update(self.extra_body)
        out.prompt_len, out.max_tokens = req.prompt_len, req.output_len
        st = time.perf_counter()
        out.start_time = st - t_origin
        last = st
        chunks_with_text = 0
        usage_completion = None
        try:
            async with self.session.post(self.url, json=body, headers=self.headers) as resp:
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    return out
                buf = b""
                async for data in resp.content.iter_any():
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        now = time.perf_counter()
                        msg = json.loads(payload)
                        if "error" in msg:
                            out.error = str(msg["error"])[:300]
                            continue
                        choices = msg.get("choices") or []
                        text = ""
                        for ch in choices:
                            text += ch.get("text") or ""
                            if ch.get("finish_reason"):
                                out.finish_reason = ch["finish_reason"]
                        usage = msg.get("usage")
                        if usage:
                            usage_completion = usage.get("completion_tokens")
                            out.server_prompt_tokens = usage.get("prompt_tokens")
                        timings = msg.get("timings")
                        if timings and out.server_prompt_tokens is None:
                            out.server_prompt_tokens = timings.get("prompt_n")
                        if text:
                            if chunks_with_text == 0:
                                out.ttft = now - st
                            else:
                                out.itl.append(now - last)
                            chunks_with_text += 1
                            last = now
            out.latency = last - st
            # Output tokens: the server's usage when given, else one token per streamed chunk
            # (llama.cpp and vLLM stream one token per chunk).
            out.output_len = usage_completion if usage_completion else chunks_with_text
            out.success = chunks_with_text > 0 and not out.error
            if not out.success and not out.error:
                out.error = "no tokens streamed"
        except Exception as e:  # noqa: BLE001
            out.success = False
            out.error = f"{type(e).__name__}: {e}"
        return out

    async def close(self):
        await self.session.close()


def make_backend(cfg):
    if cfg.backend == "thetaserve":
        return ThetaserveBackend(cfg.addr, api_key=cfg.api_key, temperature=cfg.temperature,
                                 ignore_eos=cfg.ignore_eos, seed=cfg.sampling_seed)
    if cfg.backend == "openai":
        extra = json.loads(cfg.extra_body) if cfg.extra_body else None
        return OpenAICompletionsBackend(cfg.base_url, model=cfg.model_name, api_key=cfg.api_key,
                                        temperature=cfg.temperature, ignore_eos=cfg.ignore_eos,
                                        seed=cfg.sampling_seed, extra_body=extra,
                                        min_tokens_eq_max=cfg.min_tokens_eq_max)
    raise ValueError(f"unknown backend {cfg.backend}")


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    cfg = finalize_cfg(p.parse_args(argv))
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
