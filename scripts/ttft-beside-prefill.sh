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
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
REPEATS=${REPEATS:-3}
WORDS=${WORDS:-5000}
SHORT_WORDS=${SHORT_WORDS:-0}
PORT=${PORT:-8201}
bin="${THETASERVE_BIN:-$root/build/thetaserve}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || bash scripts/fetch-model.sh
[ -x "$bin" ] || bash scripts/build.sh
source scripts/lib/serve.sh
log=$(mktemp -d)
trap 'serve_stop; rm -rf "$log"' EXIT
SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")
for rep in $(seq "$REPEATS"); do
  for limit in default 0; do
    flags=()
    [ "$limit" = 0 ] && flags=(--long-prefill-tokens 0)
    serve_start "$log/server.log" "$bin" serve --model "$model" --port 0 --metrics-port 0 \
      --http-port "$PORT" "${flags[@]}"
    line=$(python3 bench/serve/ttft_beside_prefill.py --port "$PORT" --words "$WORDS" \
    --short-words "$SHORT_WORDS")
    echo "round $rep/$REPEATS, --long-prefill-tokens $limit: $line"
    echo "$limit $line" >> "$log/results"
    serve_stop
  done
done
python3 - "$log/results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    limit, js = line.split(" ", 1)
    rows.setdefault(limit, []).append(json.loads(js))
print("\n--long-prefill-tokens  rounds  short TTFT s  short total s  long prompt s  (medians)")
for limit in ("default", "0"):
    r = rows[limit]
    med = lambda k: statistics.median(x[k] for x in r)
    print(f"{limit:<22} {len(r):<7} {med('short_ttft_s'):<13.2f} {med('short_total_s'):<14.2f} "
          f"{med('long_s'):.2f}")
PY
