#!/usr/bin/env python3
"""An urgent request that shares a running urgent request's long prefix, on a running server's
OpenAI HTTP API (--scheduling-policy priority, prefix caching on): U1 (priority 0, PREFIX
tokens of CORPUS and a question, OUTPUT tokens) starts, then a batch request (priority 5,
BATCH other tokens, 4 × OUTPUT tokens), then U2 (priority 0, the same prefix and another
question, 4 tokens). With --max-num-seqs 2 and a KV cache that holds U1 and the batch request
but not U2's whole prompt beside U1, U2 starts at once only if the scheduler counts the
prefix U1 holds as no page to make way for (it then preempts the batch request); else it
waits for a slot (U1's, when U1 ends; or the batch request's, preempted for pages). Prints one
JSON line: U2's seconds (its whole request, 4 tokens), U1's and the batch request's, whether
U2 ended before U1, and the preemptions (all, and those for an earlier priority) made before
U2 ended. scripts/shared-prefix-urgent.sh runs it."""
import argparse
import json
import re
import threading
import time
import urllib.request

from completions import post


def preemptions(port):
    """The server's (preemptions, of which for an earlier priority) so far."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()

    def counter(name):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else float("nan")
    return (counter("thetaserve_preemptions_total"),
            counter("thetaserve_priority_preemptions_total"))


def tokens(port, text):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize",
                                 data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))["count"]


def text_of(port, words, start, wanted):
    """The most words from `start` whose text is at most `wanted` tokens, and its count."""
    lo, hi = 1, wanted
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens(port, " ".join(words[start:start + mid])) <= wanted:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[start:start + lo])
    return text, tokens(port, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--corpus", default="data/kjv.txt")
    ap.add_argument("--prefix", type=int, default=1100)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--output", type=int, default=250)
    args = ap.parse_args()
    words = open(args.corpus, encoding="utf-8").read().split()
    prefix, prefix_tokens = text_of(args.port, words, 2000, args.prefix)
    batch, batch_tokens = text_of(args.port, words, 60000, args.batch)
    took = {}
    ended = {}  # seconds from U1's start
    failures = []
    t0 = time.time()

    def run(name, prompt, priority, max_tokens):
        t = time.time()
        try:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "priority": priority}
            assert json.load(post(args.port, body))["usage"]["completion_tokens"] == max_tokens
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {e!r}")
        took[name] = time.time() - t
        ended[name] = time.time() - t0

    before = preemptions(args.port)
    u1 = threading.Thread(target=run, args=("u1", prefix + " And the first question:", 0,
                                            args.output))
    u1.start()
    time.sleep(1.5)  # U1's prompt computed (its blocks in the prefix cache)
    b = threading.Thread(target=run, args=("batch", batch, 5, 4 * args.output))
    b.start()
    time.sleep(2.0)  # the batch request decoding beside U1
    run("u2", prefix + " And a second question:", 0, 4)
    after = preemptions(args.port)
    u1.join()
    b.join()
    if failures:
        raise SystemExit("failed: " + "; ".join(failures))
    print(json.dumps({"prefix_tokens": prefix_tokens, "batch_tokens": batch_tokens,
                      "u2_s": round(took["u2"], 3), "u1_s": round(took["u1"], 2),
                      "batch_s": round(took["batch"], 2),
                      "u2_ended_before_u1": ended["u2"] < ended["u1"],
                      "preemptions": after[0] - before[0],
                      "priority_preemptions": after[1] - before[1]}))


if __name__ == "__main__":
    main()
