"""The serving benchmark's prompts: BenchRequest, the length specs ('N' or 'A:B'), corpus
loading, cutting prompts to a token count (with any counter: thetaserve's Tokenize RPC through
bench_clients.GrpcTokenCounter, or the ~1.3-per-word estimate), and saving/replaying a dataset.
Split out of bench_serve.py, which re-exports the ones its callers use.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, List


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
