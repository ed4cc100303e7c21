#!/usr/bin/env python3
"""A short request's time to first token while a long prompt prefills, on a running server's
OpenAI HTTP API: the long prompt (WORDS repetitions of "river ", one output token) is sent,
then after DELAY seconds a short streaming request (4 output tokens; its prompt "Short one",
or SHORT_WORDS words); prints one JSON line
with both requests' times. scripts/ttft-beside-prefill.sh runs it against two servers
(--long-prefill-tokens at its default and 0) and prints the medians."""
import argparse
import json
import threading
import time

from completions import post, stream_times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--words", type=int, default=5000)
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--short-words", type=int, default=0,
                    help="the later request's prompt: this many words (0: 'Short one')")
    args = ap.parse_args()
    out = {}

    def long_request():
        t = time.time()
        body = json.load(post(args.port, {"prompt": "river " * args.words, "max_tokens": 1}))
        out["long_s"] = time.time() - t
        out["long_prompt_tokens"] = body["usage"]["prompt_tokens"]

    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(args.delay)
    short = "lake " * args.short_words if args.short_words else "Short one"
    out["short_ttft_s"], out["short_total_s"] = stream_times(args.port, {"prompt": short,
                                                                         "max_tokens": 4})
    th.join()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
