#!/usr/bin/env bash
# Urgent requests among batch ones under --scheduling-policy fcfs (the default) and priority:
# REPEATS rounds, each policy a fresh server on the default model with MAX_SEQS slots; BATCH
# requests of OUTPUT tokens, then URGENT short ones (bench/serve/priority_ttft.py); medians
# printed last (docs/results.md, "Priority scheduling").
#
#   scripts/priority-ttft.sh             # 3 rounds (~3 min on 2 cores)
#
# Env: REPEATS (3), MAX_SEQS (4), BATCH (8), OUTPUT (128), URGENT (4), PORT (8202),
# THETASERVE_BIN (build/thetaserve).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
REPEATS=${REPEATS:-3}
MAX_SEQS=${MAX_SEQS:-4}
BATCH=${BATCH:-8}
OUTPUT=${OUTPUT:-128}
URGENT=${URGENT:-4}
PORT=${PORT:-8202}
bin="${THETASERVE_BIN:-$root/build/thetaserve}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || bash scripts/fetch-model.sh
[ -x "$bin" ] || bash scripts/build.sh
source scripts/lib/serve.sh
log=$(mktemp -d)
trap 'serve_stop; rm -rf "$log"' EXIT
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
for rep in $(seq "$REPEATS"); do
  for policy in fcfs priority; do
    flags=()
    [ "$policy" = priority ] && flags=(--priorities)
    serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
      --http-port "$PORT" --max-num-seqs "$MAX_SEQS" --scheduling-policy "$policy"
    line=$(python3 bench/serve/priority_ttft.py --port "$PORT" --batch "$BATCH" \
      --output "$OUTPUT" --urgent "$URGENT" "${flags[@]}")
    echo "round $rep/$REPEATS, --scheduling-policy $policy: $line"
    echo "$policy $line" >> "$log/results"
    serve_stop
  done
done
python3 - "$log/results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    policy, js = line.split(" ", 1)
    rows.setdefault(policy, []).append(json.loads(js))
print("\npolicy    rounds  urgent TTFT s  urgent last TTFT s  urgent total s  batch median end s"
      "  batch last end s  preemptions  for priority  (medians)")
for policy in ("fcfs", "priority"):
    r = rows[policy]
    med = lambda k: statistics.median(x[k] for x in r)
    print(f"{policy:<9} {len(r):<7} {med('urgent_ttft_s'):<14.2f} {med('urgent_last_ttft_s'):<19.2f} "
          f"{med('urgent_total_s'):<15.2f} {med('batch_median_end_s'):<19.2f} "
          f"{med('batch_last_end_s'):<17.2f} {med('preemptions'):<12.0f} "
          f"{med('priority_preemptions'):.0f}")
PY
