"""Decode time per token under each structured-output guide, against a running server's
OpenAI-compatible HTTP API: one greedy chat at a time (the same prompt, max_tokens 300,
ignore_eos), unguided, json_object, a flat JSON schema (guided by an automaton) and a recursive
one (an outline of sections: guided by the schema's grammar). Prints the median ms per
completion token of --runs runs each, and the recursive answer's start.

    python3 bench/guided_decode_time.py --port 8000 --runs 5
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request

OUTLINE = {"$defs": {"Section": {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "subsections": {"type": "array", "items": {"$ref": "#/$defs/Section"}}},
    "required": ["title", "subsections"]}}, "$ref": "#/$defs/Section"}
FLAT = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "sections": {"type": "array", "items": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}}, "required": ["title"]}}},
    "required": ["title", "sections"]}
GUIDES = {
    "unguided": {},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema flat (automaton)": {"guided_json": FLAT},
    "json_schema recursive (grammar)": {"guided_json": OUTLINE},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    def post(body):
        req = urllib.request.Request(
            f"http://127.0.0.1:{args.port}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(req) as r:
            out = json.load(r)
        return time.perf_counter() - start, out

    base = {"messages": [{"role": "user", "content":
                          "Outline a guide to baking bread as nested sections, in JSON."}],
            "temperature": 0, "max_tokens": 300, "ignore_eos": True}
    post(base)  # warm-up
    out = None
    for name, extra in GUIDES.items():
        per_token, totals, lengths = [], [], []
        for i in range(args.runs):
            seconds, out = post({**base, **extra})
            n = out["usage"]["completion_tokens"]
            per_token.append(seconds * 1000 / n)
            totals.append(seconds)
            lengths.append(n)
            print(f"  {name} run {i + 1}/{args.runs}: {n} tokens in {seconds:.2f} s",
                  file=sys.stderr, flush=True)
        print(f"{name:34s} {statistics.median(per_token):7.2f} ms/token  "
              f"median {statistics.median(totals):.2f} s  tokens {lengths}  "
              f"finish {out['choices'][0]['finish_reason']}")
    print("recursive answer:", out["choices"][0]["message"]["content"][:300])


if __name__ == "__main__":
    main()
