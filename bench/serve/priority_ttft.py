#!/usr/bin/env python3
"""Urgent requests among batch ones, on a running server's OpenAI HTTP API: BATCH requests
(OUTPUT tokens each, EOS ignored) are sent at once, then after DELAY seconds URGENT short
streaming requests (4 output tokens), all at once. With --priorities the batch requests
carry priority 10 and the urgent ones 0 (a server run with --scheduling-policy priority);
without, neither sends one (first come, first served). Prints one JSON line: the urgent
requests' median and longest time to first token and median time to their end, the batch
requests' median and last end, and the server's preemptions (all, and those made for an
earlier priority); exits 1 if a request failed. With --refusals (a server whose --max-queue
the batch requests fill) a 429 is counted instead: urgent requests refused, batch requests
refused or displaced from the queue by urgent ones (and the server's count of the latter);
times are over the requests served (NaN if none).
scripts/priority-ttft.sh runs it against both policies."""
import argparse
import json
import re
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

from completions import post, stream_times


def counters(port):
    """The server's (preemptions, of which for an earlier priority, requests displaced from a
    full queue) so far."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()

    def counter(name):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else float("nan")
    return (counter("thetaserve_preemptions_total"),
            counter("thetaserve_priority_preemptions_total"),
            counter("thetaserve_requests_displaced_total"))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--urgent", type=int, default=4)
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--priorities", action="store_true")
    ap.add_argument("--refusals", action="store_true",
                    help="count 429s (a full queue) instead of failing on them")
    args = ap.parse_args()
    before = counters(args.port)
    batch_ends = []
    failures = []
    refused = {"batch": 0, "urgent": 0}
    t0 = time.time()

    def guarded(kind, fn):  # a failed request is reported, not a thread's lost traceback
        def run(*a):
            try:
                fn(*a)
            except urllib.error.HTTPError as e:
                if args.refusals and e.code == 429:
                    refused[kind] += 1
                else:
                    failures.append(repr(e))
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))
        return run

    def batch_request(i):
        body = {"prompt": f"Chapter {i}. It was a long summer, and", "max_tokens": args.output,
                "ignore_eos": True, "temperature": 0}
        if args.priorities:
            body["priority"] = 10
        json.load(post(args.port, body))
        batch_ends.append(time.time() - t0)

    threads = [threading.Thread(target=guarded("batch", batch_request), args=(i,))
               for i in range(args.batch)]
    for th in threads:
        th.start()
    time.sleep(args.delay)
    ttft, total = [], []

    def urgent_request(i):
        body = {"prompt": f"Question {i}: what is the capital of France?", "max_tokens": 4,
                "ignore_eos": True}
        if args.priorities:
            body["priority"] = 0
        first, end = stream_times(args.port, body)
        if first is None:
            raise RuntimeError(f"urgent request {i} streamed no text")
        ttft.append(first)
        total.append(end)

    urgent = [threading.Thread(target=guarded("urgent", urgent_request), args=(i,))
              for i in range(args.urgent)]
    for th in urgent:
        th.start()
    for th in urgent + threads:
        th.join()
    if failures:
        sys.exit("priority_ttft: " + "; ".join(failures))
    after = counters(args.port)
    nan = float("nan")
    print(json.dumps({
        "urgent_ttft_s": statistics.median(ttft) if ttft else nan,
        "urgent_last_ttft_s": max(ttft) if ttft else nan,
        "urgent_total_s": statistics.median(total) if total else nan,
        "batch_median_end_s": statistics.median(batch_ends) if batch_ends else nan,
        "batch_last_end_s": max(batch_ends) if batch_ends else nan,
        "preemptions": after[0] - before[0],
        "priority_preemptions": after[1] - before[1],
        "urgent_refused": refused["urgent"],
        "batch_refused": refused["batch"],
        "displaced": after[2] - before[2],
    }), flush=True)


if __name__ == "__main__":
    main()
