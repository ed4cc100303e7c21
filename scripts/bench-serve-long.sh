#!/usr/bin/env bash
# Issue 8, table (b), in one command: the sparse policy's effect on the maximum sustainable
# request rate on the long-prompt mix (2,048-7,936-token prompts, 32 output tokens) at fixed
# KV memory, dense vs Top-θ + policy sparse (mass budget).
#
#   scripts/bench-serve-long.sh                # the table in docs/results.md (about an hour on 2 cores)
#   NUM_PROMPTS=2 DENSE_RATES=0.05 SPARSE_RATES=0.05 scripts/bench-serve-long.sh   # a smoke run
#
# Steps: calibrate the θ file if it is missing (k = 64 post-softmax on KJV, as the fidelity
# study); measure each configuration's unloaded TTFT of the mix's longest prompt (7,936 tokens);
# fix the SLO from it *before* the sweep (p99 TTFT <= 2 x dense's unloaded TTFT); sweep Poisson
# request rates for each configuration; print the table and the maximum sustainable rates
# (bench/serve/sustainable.py) and draw the plot with the SLO line.
#
# Env: KV (default 400M), DENSE_RATES (0.02,0.026,0.034), SPARSE_RATES
# (0.02,0.026,0.034,0.044,0.055), NUM_PROMPTS per point (8), SPARSE_FLAGS (the policy flags),
# RESULTS (build/bench-serve/long-table-b), PLOT (RESULTS/serving_long_dense_vs_sparse.png),
# THETASERVE_BIN (build/thetaserve).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
KV=${KV:-400M}
DENSE_RATES=${DENSE_RATES:-0.02,0.026,0.034}
SPARSE_RATES=${SPARSE_RATES:-0.02,0.026,0.034,0.044,0.055}
NUM_PROMPTS=${NUM_PROMPTS:-8}
SPARSE_FLAGS=${SPARSE_FLAGS:---policy sparse --local-window 256 --keep-fraction 0.2}
RESULTS=${RESULTS:-$root/build/bench-serve/long-table-b}
PLOT=${PLOT:-$RESULTS/serving_long_dense_vs_sparse.png}
bin="${THETASERVE_BIN:-$root/build/thetaserve}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
theta="$root/out/fidelity/theta_k64_post.json"

[ -f "$model" ] || bash scripts/fetch-model.sh
[ -f data/kjv.txt ] || bash scripts/fetch-corpora.sh
[ -x "$bin" ] || bash scripts/build.sh
if [ ! -f "$theta" ]; then
  echo "bench-serve-long: calibrating $theta (a few minutes)"
  mkdir -p "$(dirname "$theta")"
  "$bin" calibrate --model "$model" --corpus data/kjv.txt --k 64 --placement post \
    --context 2048 --max-tokens 8192 --out "$theta"
fi
dense="dense=--kv-cache-memory $KV"
sparse="sparse=--kv-cache-memory $KV --theta $(printf '%q' "$theta") $SPARSE_FLAGS"
py="$(bash scripts/bench-serve-venv.sh)"
export THETASERVE_BIN="$bin"

echo "bench-serve-long: 1/3 unloaded TTFT of the longest prompt ($(date -u +%T))"
bash scripts/bench-serve.sh --mix long --results "$RESULTS/unloaded" --config "$dense" \
  --config "$sparse" --concurrency 1 -- --min-prompts 1 --max-prompts 1 --input-len 7936 --output-len 32
slo_ms=$("$py" -c '
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
assert p["completed"] == 1, "the unloaded request did not complete"
print(round(2 * p["median_ttft_ms"]))' "$RESULTS/unloaded/thetaserve-dense.json")
echo "bench-serve-long: SLO p99 TTFT <= ${slo_ms} ms (2 x dense unloaded; sparse unloaded:" \
  "$("$py" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["points"][0]["median_ttft_ms"]))' \
     "$RESULTS/unloaded/thetaserve-sparse.json") ms)"

echo "bench-serve-long: 2/3 sweeps ($(date -u +%T))"
bash scripts/bench-serve.sh --mix long --results "$RESULTS/sweep" --config "$dense" \
  --request-rate "$DENSE_RATES" -- --num-prompts "$NUM_PROMPTS" --goodput "ttft:$slo_ms" --save-detailed
bash scripts/bench-serve.sh --mix long --results "$RESULTS/sweep" --config "$sparse" \
  --request-rate "$SPARSE_RATES" -- --num-prompts "$NUM_PROMPTS" --goodput "ttft:$slo_ms" --save-detailed

echo "bench-serve-long: 3/3 table and plot ($(date -u +%T))"
"$py" bench/serve/plot.py "$RESULTS/sweep/thetaserve-dense.json" "$RESULTS/sweep/thetaserve-sparse.json" \
  --out "$PLOT" --slo-ttft-ms "$slo_ms" \
  --title "long-prompt mix, --kv-cache-memory $KV ($(nproc) CPUs): dense vs Top-θ + policy sparse"
"$py" bench/serve/sustainable.py "$RESULTS/sweep/thetaserve-dense.json" \
  "$RESULTS/sweep/thetaserve-sparse.json" --slo-ttft-ms "$slo_ms" | tee "$RESULTS/table-b.md"
echo "bench-serve-long: done -> $RESULTS ($(date -u +%T))"
