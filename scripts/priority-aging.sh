#!/usr/bin/env bash
# Batch requests under a steady stream of urgent ones, with strict priorities and with aging
# (bench/serve/priority_aging.py): REPEATS rounds, each --priority-aging value a fresh server on
# the default model (--scheduling-policy priority, MAX_SEQS slots); medians printed last
# (docs/results.md, "Priority aging").
#
#   scripts/priority-aging.sh            # 3 rounds of 0 and 1 level a second (~3 min on 2 cores)
#
# Env: REPEATS (3), AGING (1), MAX_SEQS (2), URGENT (4 clients), URGENT_OUTPUT (16), BATCH (2),
# BATCH_OUTPUT (64), DURATION (30 s of urgent requests), PORT (8204), THETASERVE_BIN
# (build/thetaserve).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
AGING=${AGING:-1}
MAX_SEQS=${MAX_SEQS:-2}
URGENT=${URGENT:-4}
URGENT_OUTPUT=${URGENT_OUTPUT:-16}
BATCH=${BATCH:-2}
BATCH_OUTPUT=${BATCH_OUTPUT:-64}
DURATION=${DURATION:-30}
PORT=${PORT:-8204}
source scripts/lib/serve.sh
source scripts/lib/rounds.sh
rounds_setup
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
round_serve() {
  serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
    --http-port "$PORT" --max-num-seqs "$MAX_SEQS" --scheduling-policy priority \
    --priority-aging "$1"
}
round_client() {
  python3 bench/serve/priority_aging.py --port "$PORT" --urgent "$URGENT" \
    --urgent-output "$URGENT_OUTPUT" --batch "$BATCH" --batch-output "$BATCH_OUTPUT" \
    --duration "$DURATION"
}
rounds "$log/results" --priority-aging 0 "$AGING"
rounds_medians "$log/results" aging "batch_first_end_s:batch first end s:.1f" \
  "batch_last_end_s:batch last end s:.1f" "batch_during_stream:batch in stream:.0f" \
  "urgent_ttft_s:urgent TTFT s:.3f" "urgent_p90_ttft_s:urgent p90 TTFT s:.3f" \
  "urgent_served:urgent served:.0f" "preemptions:preemptions:.0f" \
  "priority_preemptions:for priority:.0f"
