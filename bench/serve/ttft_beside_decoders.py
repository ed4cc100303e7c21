#!/usr/bin/env python3
"""A long prompt's time to first token while other requests decode, on a running server's
OpenAI HTTP API: DECODERS streaming requests (OUTPUT tokens each, EOS ignored) start, and once
every one has streamed its first text a long prompt (CHARS characters of FILE from OFFSET, or
WORDS repetitions of "river ") is sent as a streaming request of 4 tokens. Prints one JSON
line: the long prompt's time to first token and to its end, its prompt tokens, and the
decoders' median time to their end; exits 1 if a request failed or the long prompt's first
token came after a decoder had ended (it then did not run beside all of them; raise OUTPUT).
scripts/ttft-fixed-compaction.sh runs it against the sparse V policy with and without
--fixed-compaction."""
import argparse
import json
import statistics
import sys
import threading
import time

from completions import post, stream_times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--decoders", type=int, default=8)
    ap.add_argument("--output", type=int, default=512)
    ap.add_argument("--file", help="the long prompt's text (default: WORDS times 'river ')")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--chars", type=int, default=14000)
    ap.add_argument("--words", type=int, default=3000)
    args = ap.parse_args()
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompt = f.read()[args.offset:args.offset + args.chars]  # characters, not bytes
    else:
        prompt = "river " * args.words
    failures, ends = [], []
    started = threading.Semaphore(0)
    t0 = time.time()

    def decoder(i):
        first = False
        try:
            body = {"prompt": f"Chapter {i}. It was a long summer, and", "max_tokens": args.output,
                    "ignore_eos": True, "temperature": 0, "stream": True}
            for line in post(args.port, body):
                line = line.decode().strip()
                if not first and line.startswith("data: {"):
                    if json.loads(line[6:])["choices"][0]["text"]:
                        first = True
                        started.release()
            ends.append(time.time() - t0)
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))
        finally:
            if not first:
                started.release()  # the main thread must not wait for it forever

    threads = [threading.Thread(target=decoder, args=(i,)) for i in range(args.decoders)]
    for th in threads:
        th.start()
    for _ in threads:
        started.acquire()
    sent = time.time() - t0
    body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0}
    try:
        ttft, total = stream_times(args.port, body)
    except Exception as e:  # noqa: BLE001
        failures.append(repr(e))
        ttft = total = None
    for th in threads:
        th.join()
    if failures:
        sys.exit("ttft_beside_decoders: " + "; ".join(failures))
    if ttft is None:
        sys.exit("ttft_beside_decoders: the long prompt streamed no text")
    if sent + ttft > min(ends):
        sys.exit("ttft_beside_decoders: a decoder ended before the long prompt's first token "
                 f"({min(ends):.1f} s, {sent + ttft:.1f} s): raise --output")
    tokens = json.load(post(args.port, {"prompt": prompt, "max_tokens": 1}))["usage"]["prompt_tokens"]
    print(json.dumps({
        "long_ttft_s": ttft,
        "long_total_s": total,
        "long_prompt_tokens": tokens,
        "decoders_median_end_s": statistics.median(ends),
    }), flush=True)


if __name__ == "__main__":
    main()
