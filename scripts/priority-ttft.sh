#!/usr/bin/env bash
# Urgent requests among batch ones under --scheduling-policy fcfs (the default) and priority:
# REPEATS rounds, each policy a fresh server on the default model with MAX_SEQS slots; BATCH
# requests of OUTPUT tokens, then URGENT short ones (bench/serve/priority_ttft.py); medians
# printed last (docs/results.md, "Priority scheduling").
#
#   scripts/priority-ttft.sh             # 3 rounds (~3 min on 2 cores)
#   MAX_QUEUE=4 scripts/priority-ttft.sh # the waiting batch requests fill the queue: 429s
#                                        # counted (urgent refused; batch displaced by them)
#
# Env: REPEATS (3), MAX_SEQS (4), BATCH (8), OUTPUT (128), URGENT (4), MAX_QUEUE (unset: the
# server's 1024), PORT (8202), THETASERVE_BIN (build/thetaserve).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
MAX_SEQS=${MAX_SEQS:-4}
BATCH=${BATCH:-8}
OUTPUT=${OUTPUT:-128}
URGENT=${URGENT:-4}
PORT=${PORT:-8202}
MAX_QUEUE=${MAX_QUEUE:-}
source scripts/lib/serve.sh
source scripts/lib/rounds.sh
rounds_setup
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
queue_flags=()
[ -n "$MAX_QUEUE" ] && queue_flags=(--max-queue "$MAX_QUEUE")
round_serve() {
  serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
    --http-port "$PORT" --max-num-seqs "$MAX_SEQS" --scheduling-policy "$1" "${queue_flags[@]}"
}
round_client() {
  local flags=()
  [ "$1" = priority ] && flags=(--priorities)
  [ -n "$MAX_QUEUE" ] && flags+=(--refusals)
  python3 bench/serve/priority_ttft.py --port "$PORT" --batch "$BATCH" \
    --output "$OUTPUT" --urgent "$URGENT" "${flags[@]}"
}
rounds "$log/results" --scheduling-policy fcfs priority
rounds_medians "$log/results" policy "urgent_ttft_s:urgent TTFT s:.2f" \
  "urgent_last_ttft_s:urgent last TTFT s:.2f" "urgent_total_s:urgent total s:.2f" \
  "batch_median_end_s:batch median end s:.2f" "batch_last_end_s:batch last end s:.2f" \
  "preemptions:preemptions:.0f" "priority_preemptions:for priority:.0f" \
  "urgent_refused:urgent refused:.0f" "batch_refused:batch refused:.0f" \
  "displaced:displaced:.0f"
