"""The serving benchmark's clients: the gRPC stubs generated from proto/, thetaserve's
Tokenize RPC as a token counter, RequestOutput (what one streamed request measured), and the two
backends that stream a request and fill it: ThetaserveBackend (gRPC) and
OpenAICompletionsBackend (HTTP /v1/completions with SSE). Split out of bench_serve.py, which
re-exports the names its callers use.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

from bench_dataset import BenchRequest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROTO_ROOT = ROOT / "proto"
GEN = pathlib.Path(os.environ.get("BENCH_SERVE_GEN", ROOT / "build" / "bench-serve-gen"))


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


def _failed(out: RequestOutput, e: Exception):
    """Records an exception no backend expected as the request's failure."""
    out.success = False
    out.error = f"{type(e).__name__}: {e}"


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
                    if c.timings.HasField("time_to_first_token_seconds"):
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
            _failed(out, e)
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
            _failed(out, e)
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
