#!/usr/bin/env python3
"""Self-checks of the serving benchmark that need no model: the metric definitions, the
length specs, prompt cutting, and the OpenAI backend against a fake streaming server on
loopback (aiohttp). Run: build/bench-serve-venv/bin/python bench/serve/test_bench_serve.py
"""
import argparse
import asyncio
import importlib.util
import json
import pathlib
import random
import socket
import sys
import tempfile
import threading
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_serve  # noqa: E402
import metrics  # noqa: E402
import sustainable  # noqa: E402


class Out:
    def __init__(self, success=True, prompt_len=10, output_len=5, ttft=0.1, latency=0.5, itl=(),
                 server_prompt_tokens=None):
        self.success, self.prompt_len, self.output_len = success, prompt_len, output_len
        self.ttft, self.latency, self.itl = ttft, latency, list(itl)
        self.server_prompt_tokens = server_prompt_tokens


class MetricsTest(unittest.TestCase):
    def test_percentile_matches_numpy_linear(self):
        xs = [5.0, 1.0, 3.0, 2.0, 4.0]
        self.assertAlmostEqual(metrics.percentile(xs, 50), 3.0)
        self.assertAlmostEqual(metrics.percentile(xs, 90), 4.6)
        self.assertAlmostEqual(metrics.percentile(xs, 99), 4.96)
        self.assertEqual(metrics.percentile([], 50), 0.0)
        try:
            import numpy as np
            rng = random.Random(3)
            ys = [rng.random() for _ in range(101)]
            for p in (1, 37.5, 90, 99):
                self.assertAlmostEqual(metrics.percentile(ys, p), float(np.percentile(ys, p)))
            self.assertAlmostEqual(metrics.std(ys), float(np.std(ys)))
        except ImportError:
            pass

    def test_vllm_definitions(self):
        outs = [
            Out(prompt_len=10, output_len=5, ttft=0.1, latency=0.5, itl=[0.1] * 4),
            Out(prompt_len=20, output_len=1, ttft=0.3, latency=0.3),  # no TPOT sample
            Out(success=False, prompt_len=30, output_len=0),
        ]
        r = metrics.calculate(outs, 2.0, [90, 99], {"ttft": 200, "tpot": 150})
        self.assertEqual(r["completed"], 2)
        self.assertEqual(r["failed"], 1)
        self.assertEqual(r["total_input_tokens"], 30)  # failed requests do not count
        self.assertEqual(r["total_output_tokens"], 6)
        self.assertAlmostEqual(r["request_throughput"], 1.0)
        self.assertAlmostEqual(r["output_throughput"], 3.0)
        self.assertAlmostEqual(r["total_token_throughput"], 18.0)
        # TPOT = (e2e - ttft) / (n - 1) = 0.4 / 4 = 100 ms, only for the 5-token request
        self.assertAlmostEqual(r["mean_tpot_ms"], 100.0)
        self.assertAlmostEqual(r["median_ttft_ms"], 200.0)
        self.assertAlmostEqual(r["mean_itl_ms"], 100.0)
        self.assertAlmostEqual(r["p99_e2el_ms"], 300 + 0.99 * 200)
        # goodput: request 1 (ttft 100 <= 200, tpot 100 <= 150) is good; request 2's TTFT of
        # 300 ms misses the SLO (its TPOT counts as 0)
        self.assertEqual(r["good_requests"], 1)
        self.assertAlmostEqual(r["request_goodput"], 0.5)

    def test_prompt_len_mismatch_counted(self):
        r = metrics.calculate([Out(server_prompt_tokens=11), Out(server_prompt_tokens=10)],
                              1.0, [99], {})
        self.assertEqual(r["prompt_len_mismatches"], 1)
        self.assertIsNone(r["request_goodput"])


class DatasetTest(unittest.TestCase):
    def test_length_specs(self):
        rng = random.Random(0)
        self.assertEqual(bench_serve.parse_length_spec("64")(rng), 64)
        vals = {bench_serve.parse_length_spec("3:5")(rng) for _ in range(200)}
        self.assertEqual(vals, {3, 4, 5})
        with self.assertRaises(ValueError):
            bench_serve.parse_length_spec("5:3")

    def test_make_prompt_is_largest_prefix_within_target(self):
        words = [f"w{i}" for i in range(5000)]

        def count(text):  # a tokenizer where word i costs 1 + i % 3 tokens
            return sum(1 + int(w[1:]) % 3 for w in text.split())
        for target in (1, 2, 7, 128, 500):
            text, n = bench_serve.make_prompt(words, 100, target, count, [1.3])
            self.assertEqual(n, count(text))
            self.assertLessEqual(n, max(target, count(words[100])))
            k = len(text.split())
            self.assertGreater(count(" ".join(words[100:100 + k + 1])), target)

    def test_dataset_deterministic(self, ):
        tmp = pathlib.Path(self.id().replace(".", "_") + ".txt")
        tmp = pathlib.Path("/tmp") / tmp
        tmp.write_text(" ".join(f"word{i}" for i in range(3000)))
        try:
            a = bench_serve.build_dataset(5, "10:20", "3", [str(tmp)],
                                          bench_serve.word_token_counter, 7, progress=False)
            b = bench_serve.build_dataset(5, "10:20", "3", [str(tmp)],
                                          bench_serve.word_token_counter, 7, progress=False)
            self.assertEqual([x.prompt for x in a], [x.prompt for x in b])
            self.assertTrue(all(x.output_len == 3 for x in a))
            self.assertTrue(all(x.prompt_len <= 20 for x in a))
        finally:
            tmp.unlink()

    def test_shared_prefix_starts_every_prompt(self):
        tmp = pathlib.Path("/tmp") / (self.id().replace(".", "_") + ".txt")
        tmp.write_text(" ".join(f"word{i}" for i in range(3000)))
        try:
            reqs = bench_serve.build_dataset(6, "10", "3", [str(tmp)],
                                             bench_serve.word_token_counter, 7, progress=False,
                                             shared_prefix_len=40)
            first = reqs[0].prompt.split()[:30]
            self.assertEqual(len(first), 30)
            for r in reqs:
                words = r.prompt.split()
                self.assertEqual(words[:30], first)
                self.assertEqual(r.prompt_len, bench_serve.word_token_counter(r.prompt))
                self.assertGreater(r.prompt_len, 40)
            # The parts after the prefix differ.
            self.assertEqual(len({" ".join(r.prompt.split()[30:]) for r in reqs}), 6)
        finally:
            tmp.unlink()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class CommandLineTest(unittest.TestCase):
    """Bad flags end as argparse's errors (exit 2, the flag named) before anything runs: they
    were tracebacks, a silent 'unlimited' for --concurrency 0, or a result file found
    unwritable after the whole run."""

    def test_bad_flags_are_refused_up_front(self):
        import contextlib
        import io
        cases = [(["--request-rate", "-1"], "--request-rate must be > 0"),
                 (["--concurrency", "0"], "--concurrency must be >= 1"),
                 (["--input-len", "0"], "--input-len: length '0': need >= 1"),
                 (["--output-len", "5:2"], "--output-len: length range '5:2'"),
                 (["--goodput", "ttft"], "--goodput:"),
                 (["--goodput", "latency:5"], "--goodput: goodput SLO 'latency'"),
                 (["--corpus", "/nonexistent/c.txt"], "--corpus /nonexistent/c.txt: no such file"),
                 (["--result-file", tempfile.gettempdir()], "cannot be written")]
        for argv, message in cases:
            err = io.StringIO()
            with self.subTest(argv=argv), contextlib.redirect_stderr(err):
                with self.assertRaises(SystemExit) as e:
                    bench_serve.main(argv)
                self.assertEqual(e.exception.code, 2)
                self.assertIn(message, err.getvalue())


class SustainableRateTest(unittest.TestCase):
    @staticmethod
    def point(rate, completed_rate, p99_s, failed=0, requests=None):
        p = {"request_rate": rate, "request_throughput": completed_rate, "p99_ttft_ms": p99_s * 1000,
             "completed": 8 - failed, "failed": failed, "num_prompts": 8, "median_ttft_ms": 0,
             "median_tpot_ms": 0}
        if requests is not None:
            p["requests"] = requests
        return p

    def test_slo_and_growing_queue(self):
        run = {"config": "x", "points": [self.point(0.04, 0.035, 150), self.point(0.01, 0.01, 50),
                                         self.point(0.02, 0.019, 100)]}
        _, (m,) = sustainable.summarize([run], slo_ms=120_000, min_completed=0.9)
        # 0.01 and 0.02 meet the SLO (sorted by rate, whatever the file order); 0.04 misses it.
        self.assertEqual(m.by_slo, 0.02)
        self.assertEqual(m.by_sustained, 0.02)
        self.assertAlmostEqual(m.best_completed, 0.035)
        self.assertFalse(m.slo_open_ended)

    def test_a_point_that_keeps_a_growing_queue_is_not_sustained(self):
        run = {"config": "x", "points": [self.point(0.02, 0.02, 50), self.point(0.04, 0.03, 60)]}
        _, (m,) = sustainable.summarize([run], slo_ms=120_000, min_completed=0.9)
        self.assertEqual(m.by_slo, 0.04)  # the SLO alone passes both
        self.assertEqual(m.by_sustained, 0.02)  # 0.03 of 0.04 offered is a growing queue
        self.assertTrue(m.slo_open_ended)

    def test_failures_and_a_first_miss_leave_nothing(self):
        failed = {"config": "x", "points": [self.point(0.01, 0.01, 50, failed=1), self.point(0.02, 0.02, 50)]}
        missed = {"config": "y", "points": [self.point(0.01, 0.01, 500), self.point(0.02, 0.02, 50)]}
        _, maxima = sustainable.summarize([failed, missed], slo_ms=120_000, min_completed=0.9)
        for m in maxima:
            self.assertIsNone(m.by_slo, f"{m.config}: a pass after a failure must not count")
            self.assertIsNone(m.by_sustained)
            self.assertFalse(m.slo_open_ended)

    def test_pass_fail_pass_is_not_open_ended(self):
        run = {"config": "x", "points": [self.point(0.01, 0.01, 50), self.point(0.02, 0.02, 500),
                                         self.point(0.03, 0.03, 50)]}
        _, (m,) = sustainable.summarize([run], slo_ms=120_000, min_completed=0.9)
        self.assertEqual(m.by_slo, 0.01)
        self.assertFalse(m.slo_open_ended)

    def test_an_empty_run_prints(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "empty.json"
            path.write_text(json.dumps({"config": "x", "points": []}))
            self.assertEqual(sustainable.main([str(path), "--slo-ttft-ms", "1000"]), 0)

    def test_departures_against_arrivals_when_requests_were_saved(self):
        # Sends every 10 s; a stable server finishes each 100 s later (ratio 1) although the
        # drain makes completed/offered look low; a growing queue finishes every 20 s.
        def reqs(service_gap):
            return [{"success": True, "start_time": 10.0 * i, "latency": 100.0 + (service_gap - 10.0) * i}
                    for i in range(8)]
        stable = self.point(0.1, 0.8 / (70 + 100) * 10, 100, requests=reqs(10.0))
        growing = self.point(0.1, 0.8 / (140 + 100) * 10, 100, requests=reqs(20.0))
        self.assertAlmostEqual(sustainable.keeps_up(stable)[0], 1.0)
        self.assertAlmostEqual(sustainable.keeps_up(growing)[0], 0.5)
        self.assertTrue(sustainable.sustained(stable, 120_000, 0.9))
        self.assertFalse(sustainable.sustained(growing, 120_000, 0.9))
        self.assertLess(sustainable.keeps_up({k: v for k, v in stable.items() if k != "requests"})[0], 0.9,
                        "without per-request data the drain biases the ratio down")


class FakeOpenAIServer:
    """Streams max_tokens chunks of one token each, llama.cpp style, with usage at the end."""

    def __init__(self):
        from aiohttp import web
        self.web = web
        self.port = free_port()
        self.bodies = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def completions(self, request):
        web = self.web
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        for i in range(n):
            await asyncio.sleep(0.005)
            chunk = {"choices": [{"text": f" t{i}", "index": 0,
                                  "finish_reason": "length" if i == n - 1 else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"].split()),
                                          "completion_tokens": n}}
        await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _run(self):
        web = self.web
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        self.loop.run_until_complete(site.start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *a):
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class OpenAIBackendTest(unittest.TestCase):
    def test_closed_loop_against_fake_server(self):
        if importlib.util.find_spec("aiohttp") is None:
            self.skipTest("aiohttp not installed")
        with FakeOpenAIServer() as srv:
            p = argparse.ArgumentParser()
            bench_serve.add_args(p)
            cfg = bench_serve.finalize_cfg(p.parse_args(
                ["--backend", "openai", "--base-url", f"http://127.0.0.1:{srv.port}",
                 "--concurrency", "3", "--ignore-eos", "--min-tokens-eq-max", "--disable-tqdm",
                 "--goodput", "ttft:5000"]))
            reqs = [bench_serve.BenchRequest(prompt="a b c", prompt_len=3, output_len=4 + i)
                    for i in range(7)]
            r = bench_serve.run_benchmark(cfg, reqs)
        self.assertEqual(r["completed"], 7)
        self.assertEqual(r["total_output_tokens"], sum(4 + i for i in range(7)))
        self.assertEqual(r["prompt_len_mismatches"], 0)
        self.assertEqual(r["good_requests"], 7)
        self.assertGreater(r["median_tpot_ms"], 1.0)
        self.assertTrue(all(b["ignore_eos"] and b["stream"] for b in srv.bodies))
        self.assertTrue(all(b["min_tokens"] == b["max_tokens"] for b in srv.bodies))
        self.assertEqual(len(srv.bodies), 8)  # 7 + the warm-up request


if __name__ == "__main__":
    unittest.main()
