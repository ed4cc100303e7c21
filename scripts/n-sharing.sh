#!/usr/bin/env bash
# n completions of one long prompt, three ways: one call with n (GenerateRequest.n, OpenAI's
# n) and the prefix cache on (the first completion computes the prompt, the others adopt its
# blocks); n calls of one completion each, sent at once, cache on (admitted together, each
# computes the prompt); one call with n and the cache off. For each: prompt tokens computed (the
# thetaserve_prompt_tokens_total metric), the most KV pages requests held at once (status,
# sampled every 0.1 s), and the wall time until every completion is out. REPEATS runs per
# configuration, each on a fresh server; the medians are printed last.
#
#   scripts/n-sharing.sh
#   N=16 PROMPT_WORDS=1500 OUT=32 REPEATS=5 scripts/n-sharing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/thetaserve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
N=${N:-8}
OUT=${OUT:-32}
PROMPT_WORDS=${PROMPT_WORDS:-800}
REPEATS=${REPEATS:-3}
KV=${KV:-256M}
PORT=${PORT:-52051}
MPORT=${MPORT:-52090}
source scripts/lib/serve.sh
SERVE_PROBE=("$BIN" health --addr "127.0.0.1:$PORT")

prompt=$(python3 - "$PROMPT_WORDS" <<'PY'
import sys
words = open("data/austen.txt", encoding="utf-8").read().split()
print(" ".join(words[:int(sys.argv[1])]))
PY
)

metric() {  # name: its value on the running server
  python3 - "$MPORT" "$1" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
print(next(l.split()[-1] for l in text.splitlines() if l.startswith(sys.argv[2] + " ")))
PY
}

run_once() {  # config (n | separate | n-nocache) -> "prompt_tokens peak_pages seconds"
  trap serve_stop EXIT  # (run in $(...), a subshell: the server goes down with it)
  local caching=on
  [ "$1" != n-nocache ] || caching=off
  serve_start "/tmp/n-sharing-$1.log" "$BIN" serve --model "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --metrics-port "$MPORT" --kv-cache-memory "$KV" --prefix-caching "$caching" ||
    exit 1
  local samples=/tmp/n-sharing-$1.samples
  : >"$samples"
  local t0 t1 clients=()
  local client=("$BIN" client --addr "127.0.0.1:$PORT" --prompt "$prompt" --max-tokens "$OUT"
                --temperature 0.8 --ignore-eos)
  t0=$(date +%s.%N)
  if [ "$1" = separate ]; then
    for i in $(seq 1 "$N"); do "${client[@]}" --seed "$i" >/dev/null 2>&1 & clients+=($!); done
  else
    "${client[@]}" --seed 1 --n "$N" >/dev/null 2>&1 & clients+=($!)
  fi
  while kill -0 "${clients[@]}" 2>/dev/null; do
    "$BIN" status --addr "127.0.0.1:$PORT" >>"$samples" 2>/dev/null || true
    sleep 0.1
  done
  wait "${clients[@]}"
  t1=$(date +%s.%N)
  local computed
  computed=$(metric thetaserve_prompt_tokens_total)
  serve_stop
  local peak
  peak=$(awk '{u = $8 + $10; if (u > m) m = u} END {print m + 0}' "$samples")
  echo "$computed $peak $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')"
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "$N completions of one ~$PROMPT_WORDS-word prompt, $OUT tokens each, --kv-cache-memory $KV, $REPEATS runs"
configs="n separate n-nocache"
declare -A results
for config in $configs; do
  for r in $(seq 1 "$REPEATS"); do
    line=$(run_once "$config")
    echo "  $config, run $r: prompt tokens computed, peak KV pages, seconds: $line" >&2
    results[$config]+="$line"$'\n'
  done
done
label() {
  case $1 in
    n) echo "one call, n = $N, prefix cache on" ;;
    separate) echo "$N calls at once, prefix cache on" ;;
    n-nocache) echo "one call, n = $N, prefix cache off" ;;
  esac
}
printf '%-36s %22s %14s %9s\n' "" "prompt tokens computed" "peak KV pages" "seconds"
for config in $configs; do
  col() { printf '%s' "${results[$config]}" | awk -v c="$1" 'NF {print $c}' | median; }
  printf '%-36s %22s %14s %9s\n' "$(label "$config")" "$(col 1)" "$(col 2)" "$(col 3)"
done
