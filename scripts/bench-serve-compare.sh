#!/usr/bin/env bash
# Table (a) of the serving benchmark (issue 8): thetaserve (default flags; --threads N is the
# only flag set, and N = nproc is its default) against llama.cpp's llama-server with the same
# threads, on the same machine, model file and prompts, closed loop at each concurrency.
# The two servers take turns point by point (ours at C, the peer at C, then the next C), so a
# shared machine's changing background load hits both alike; each point starts its server
# fresh. Results: build/bench-serve/compare-<mix>/ (JSON per server, server logs, dataset.json,
# serving.png, summary tables).
#
#   scripts/bench-serve-compare.sh                          # C = 1,8,32,64, short mix
#   scripts/bench-serve-compare.sh --concurrency 1,8 --mix short -- --prompts-per-concurrency 4
#
# Flags: --concurrency LIST, --threads LIST (CPU threads of both servers, one configuration each;
# default: nproc, thetaserve's default), --mix short|long, --results DIR, -- ARGS passed to both sweeps
# (e.g. --prompts-per-concurrency 3 --min-prompts 16). Both servers replay RESULTS/dataset.json
# (made, and grown when a larger point needs more prompts, with thetaserve's tokenizer; the
# prompts are a deterministic sequence, so growing it keeps the first ones).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
concurrency="1,8,32,64"
threads="$(nproc)"
mix=short
results=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --concurrency) concurrency="$2"; shift 2 ;;
    --mix) mix="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench-serve-compare: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
results="${results:-$root/build/bench-serve/compare-$mix}"
mkdir -p "$results"
IFS=, read -r -a cs <<<"$concurrency"
IFS=, read -r -a ts <<<"$threads"
for c in "${cs[@]}"; do
  for t in "${ts[@]}"; do
    bash "$root/scripts/bench-serve.sh" --mix "$mix" --results "$results" --concurrency "$c" \
      --config "t$t=--threads $t" -- --append "${extra[@]}"
    bash "$root/scripts/bench-serve-peer.sh" --mix "$mix" --results "$results" \
      --concurrency "$c" --threads "$t" -- --append "${extra[@]}"
  done
done
venv="$root/build/bench-serve-venv"
"$venv/bin/python" "$root/bench/serve/plot.py" "$results"/thetaserve-*.json \
  "$results"/llama-server-*.json --out "$results/serving.png" \
  --title "$mix-prompt mix, closed loop, $(nproc) CPUs: thetaserve vs llama.cpp llama-server" \
  | tee "$results/table.md"
echo "bench-serve-compare: done -> $results"
