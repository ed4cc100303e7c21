#!/usr/bin/env bash
# An urgent request sharing a running urgent request's long prefix while a batch request fills
# the rest of a small KV cache (bench/serve/shared_prefix_urgent.py): REPEATS rounds, each a
# fresh server on the default model (--scheduling-policy priority, --max-num-seqs 2,
# --kv-cache-memory KV); medians printed last (docs/results.md, "Making way for a shared
# prefix").
#
#   scripts/shared-prefix-urgent.sh      # 3 rounds (~1 min on 2 cores)
#
# Env: REPEATS (3), KV (48M: 2,176 tokens in f16, as the CPU backend stores them), PREFIX
# (1100), BATCH (500), OUTPUT (250: U1's tokens; the batch request's 4×), PORT (8203),
# THETASERVE_BIN (build/thetaserve).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
KV=${KV:-48M}
PREFIX=${PREFIX:-1100}
BATCH=${BATCH:-500}
OUTPUT=${OUTPUT:-250}
PORT=${PORT:-8203}
source scripts/lib/serve.sh
source scripts/lib/rounds.sh
rounds_setup
[ -f data/kjv.txt ] || bash scripts/fetch-corpora.sh
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
round_serve() {
  serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
    --http-port "$PORT" --scheduling-policy priority --max-num-seqs 2 --kv-cache-memory "$1"
}
round_client() {
  python3 bench/serve/shared_prefix_urgent.py --port "$PORT" --prefix "$PREFIX" \
    --batch "$BATCH" --output "$OUTPUT"
}
rounds "$log/results" --kv-cache-memory "$KV"
rounds_medians "$log/results" kv "u2_s:U2 s:.3f" "u1_s:U1 s:.2f" "batch_s:batch s:.2f" \
  "u2_ended_before_u1:U2 before U1:.0f" "preemptions:preemptions:.0f" \
  "priority_preemptions:for priority:.0f"
