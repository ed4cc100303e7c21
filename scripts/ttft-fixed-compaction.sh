#!/usr/bin/env bash
# What `serve --fixed-compaction` costs a long prompt's time to first token beside decoding
# requests (docs/top-theta.md): Top-θ with the sparse V policy, with and without the flag,
# REPEATS rounds, each configuration a fresh server on the default model, medians last. Under
# load a prompt gets the step's budget less one token per decoding request, so with the flag it
# reaches each compaction point in two steps, the second short.
#
#   scripts/ttft-fixed-compaction.sh       # 3 rounds, ~3,200 tokens of Austen beside 8 streams
#
# Env: REPEATS (3), THETA (a θ file; default: calibrated first on data/kjv.txt, k 64, post,
# ~2 min on 2 cores), DECODERS (8), OUTPUT (512: each decoder's tokens; they must outlast the
# prompt), CHARS (14000 characters of data/austen.txt from OFFSET 200000), PORT (8202),
# DEVICE (auto), THETASERVE_BIN (build/thetaserve).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
DECODERS=${DECODERS:-8}
OUTPUT=${OUTPUT:-512}
CHARS=${CHARS:-14000}
OFFSET=${OFFSET:-200000}
PORT=${PORT:-8202}
DEVICE=${DEVICE:-auto}
source scripts/lib/serve.sh
source scripts/lib/rounds.sh
rounds_setup
if [ ! -f data/austen.txt ] || [ ! -f data/kjv.txt ]; then bash scripts/fetch-corpora.sh; fi
theta="${THETA:-}"
if [ -z "$theta" ]; then
  theta="$log/theta.json"
  echo "calibrating θ on data/kjv.txt (k 64, post-softmax) ..."
  "$bin" calibrate --model "$model" --corpus data/kjv.txt --k 64 --placement post \
    --context 512 --max-tokens 4096 --out "$theta"
fi
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
round_serve() {
  local flags=()
  [ "$1" = fixed ] && flags=(--fixed-compaction)
  serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
    --http-port "$PORT" --device "$DEVICE" --theta "$theta" --policy sparse \
    --local-window 128 "${flags[@]}"
}
round_client() {
  python3 bench/serve/ttft_beside_decoders.py --port "$PORT" --decoders "$DECODERS" \
    --output "$OUTPUT" --file data/austen.txt --offset "$OFFSET" --chars "$CHARS"
}
rounds "$log/results" compaction default fixed
rounds_medians "$log/results" compaction "long_ttft_s:long TTFT s:.2f" \
  "long_prompt_tokens:prompt tokens:.0f" "decoders_median_end_s:decoders end s:.1f"
