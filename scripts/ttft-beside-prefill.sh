#!/usr/bin/env bash
# A short request's time to first token while a long prompt prefills, with the scheduler's
# --long-prefill-tokens at its default (a quarter of the step's token budget) and off (0):
# REPEATS rounds, each configuration a fresh server on the default model, medians printed last
# (docs/results.md, "A short request beside a long prefill").
#
#   scripts/ttft-beside-prefill.sh             # 3 rounds, a 5,000-token prompt (~4 min on 2 cores)
#
# Env: REPEATS (3), WORDS (5000: the long prompt, ~1 token each), SHORT_WORDS (0: the later
# request's prompt is "Short one"; N: N words), PORT (8201), THETASERVE_BIN (build/thetaserve).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
WORDS=${WORDS:-5000}
SHORT_WORDS=${SHORT_WORDS:-0}
PORT=${PORT:-8201}
source scripts/lib/serve.sh
source scripts/lib/rounds.sh
rounds_setup
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
round_serve() {
  local flags=()
  [ "$1" = 0 ] && flags=(--long-prefill-tokens 0)
  serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
    --http-port "$PORT" "${flags[@]}"
}
round_client() {
  python3 bench/serve/ttft_beside_prefill.py --port "$PORT" --words "$WORDS" \
    --short-words "$SHORT_WORDS"
}
rounds "$log/results" --long-prefill-tokens default 0
rounds_medians "$log/results" --long-prefill-tokens "short_ttft_s:short TTFT s:.2f" \
  "short_total_s:short total s:.2f" "long_s:long prompt s:.2f"
