#!/usr/bin/env python3
"""Batch requests under a steady stream of urgent ones, on a running server's OpenAI HTTP API
(a server run with --scheduling-policy priority, with or without --priority-aging): URGENT
clients each send short streaming requests (priority 0, URGENT_OUTPUT tokens) one after
another for DURATION seconds, enough to keep the slots busy; after DELAY seconds BATCH
requests (priority 10, BATCH_OUTPUT tokens, EOS ignored) are sent at once. Strict priorities
keep the batch requests waiting (or preempted as soon as they start) until the urgent stream
ends; with aging they overtake urgent requests that arrive long enough after them.

Prints one JSON line: the batch requests' first and last end (seconds from when they were
sent) and how many ended while urgent requests were still being sent; the urgent requests' median and
90th-percentile time to first token and how many were served; the server's preemptions (all,
and those made for an earlier priority). Exits 1 if a request failed.
scripts/priority-aging.sh runs it against servers with and without aging."""
import argparse
import json
import statistics
import sys
import threading
import time

from completions import post, stream_times
from priority_ttft import counters


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--urgent", type=int, default=4, help="urgent clients")
    ap.add_argument("--urgent-output", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batch-output", type=int, default=64)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--delay", type=float, default=1.0)
    args = ap.parse_args()
    before = counters(args.port)
    failures, ttft, batch_ends = [], [], []
    stream_end = time.monotonic() + args.duration

    def guarded(fn):  # a failed request is reported, not a thread's lost traceback
        def run(*a):
            try:
                fn(*a)
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))
        return run

    def urgent_client(c):
        i = 0
        while time.monotonic() < stream_end:
            body = {"prompt": f"Question {c}.{i}: what is the capital of France?",
                    "max_tokens": args.urgent_output, "ignore_eos": True, "temperature": 0,
                    "priority": 0}
            first, _ = stream_times(args.port, body)
            if first is None:
                raise RuntimeError(f"urgent request {c}.{i} streamed no text")
            ttft.append(first)
            i += 1

    def batch_request(i):
        sent = time.monotonic()
        body = {"prompt": f"Chapter {i}. It was a long summer, and",
                "max_tokens": args.batch_output, "ignore_eos": True, "temperature": 0,
                "priority": 10}
        json.load(post(args.port, body))
        end = time.monotonic()
        batch_ends.append((end - sent, end < stream_end))

    urgent = [threading.Thread(target=guarded(urgent_client), args=(c,))
              for c in range(args.urgent)]
    for th in urgent:
        th.start()
    time.sleep(args.delay)
    batch = [threading.Thread(target=guarded(batch_request), args=(i,))
             for i in range(args.batch)]
    for th in batch:
        th.start()
    for th in urgent + batch:
        th.join()
    if failures:
        sys.exit("priority_aging: " + "; ".join(failures))
    if not batch_ends or not ttft:
        sys.exit("priority_aging: no batch request sent or no urgent request served")
    after = counters(args.port)
    ends = sorted(e for e, _ in batch_ends)
    ttft.sort()
    print(json.dumps({
        "batch_first_end_s": ends[0],
        "batch_last_end_s": ends[-1],
        "batch_during_stream": sum(1 for _, during in batch_ends if during),
        "urgent_ttft_s": statistics.median(ttft),
        "urgent_p90_ttft_s": ttft[int(0.9 * (len(ttft) - 1))],
        "urgent_served": len(ttft),
        "preemptions": after[0] - before[0],
        "priority_preemptions": after[1] - before[1],
    }), flush=True)


if __name__ == "__main__":
    main()
