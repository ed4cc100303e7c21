#!/usr/bin/env bash
# How many long-prompt sequences the server holds at once, dense vs Top-θ policy sparse (and
# offload), at the same --kv-cache-memory. Starts the server on loopback for each configuration, sends N
# concurrent requests (prompts of ~PROMPT_WORDS words of Austen, OUT output tokens), samples
# GetServerStatus twice a second, and prints the mean and max running count.
#
#   THETA=out/fidelity/theta_k64_post.json scripts/sparse-capacity.sh
#   THETA=... KEEP=0.05 LW=512 PROMPT_WORDS=3000 KV=500M N=10 scripts/sparse-capacity.sh
# KEEP: the sparse policy's mass budget (--keep-fraction); unset: the obs-window rule.
# CONFIGS: which configurations, in order (default "dense sparse"; also "offload": the sparse
# policy's rule with the rows it drops moved to host memory). KV_DTYPE: --kv-cache-dtype for
# every configuration (default: the server's, f16 on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/thetaserve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THETA=${THETA:-}
KV=${KV:-160M}
N=${N:-24}
OUT=${OUT:-32}
PROMPT_WORDS=${PROMPT_WORDS:-1000}
PORT=${PORT:-51051}
LW=${LW:-128}
OBS=${OBS:-32}
source scripts/lib/serve.sh
trap serve_stop EXIT
KEEP=${KEEP:-}
CONFIGS=${CONFIGS:-dense sparse}
KV_DTYPE=${KV_DTYPE:-}
dtype=()
[ -z "$KV_DTYPE" ] || dtype=(--kv-cache-dtype "$KV_DTYPE")

prompt_for() {  # a distinct ~PROMPT_WORDS-word slice of Austen per request
  python3 - "$1" "$PROMPT_WORDS" <<'PY'
import sys
i, n = int(sys.argv[1]), int(sys.argv[2])
words = open("data/austen.txt", encoding="utf-8").read().split()
print(" ".join(words[i * n:(i + 1) * n]))
PY
}

measure() {  # name, then server flags
  local name=$1; shift
  SERVE_PROBE=("$BIN" health --addr "127.0.0.1:$PORT")
  serve_start "/tmp/capacity-$name.log" "$BIN" serve --model "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --metrics-port 0 --kv-cache-memory "$KV" --max-num-seqs 64 "${dtype[@]}" "$@" ||
    exit 1
  local clients=()
  for i in $(seq 0 $((N - 1))); do
    "$BIN" client --addr "127.0.0.1:$PORT" --prompt "$(prompt_for "$i")" --max-tokens "$OUT" \
      >/dev/null 2>&1 &
    clients+=($!)
  done
  local samples="/tmp/capacity-$name.samples"
  : >"$samples"
  while kill -0 "${clients[@]}" 2>/dev/null; do
    "$BIN" status --addr "127.0.0.1:$PORT" >>"$samples" 2>/dev/null || true
    sleep 0.5
  done
  wait "${clients[@]}" 2>/dev/null || true
  serve_stop
  # Capacity = sequences running while others wait for pages (the pool is the limit).
  awk -v name="$name" '$4 > 0 {r=$2; s+=r; n++; if (r>m) m=r} {if ($14>p) p=$14} {if ($26>h) h=$26}
    END {printf "%-8s samples with requests waiting %d  running mean %.2f  max %d  preemptions %d  host pages max %d\n", name, n, s/n, m, p, h}' "$samples"
}

rule=(--obs-window "$OBS")
[ -z "$KEEP" ] || rule=(--keep-fraction "$KEEP")
echo "kv-cache-memory $KV${KV_DTYPE:+ of $KV_DTYPE}, $N requests of ~$PROMPT_WORDS words + $OUT tokens, local window $LW, ${rule[*]}"
for config in $CONFIGS; do
  case $config in
    dense) measure dense ;;
    sparse|offload)
      [ -n "$THETA" ] || { echo "set THETA to a θ file from thetaserve calibrate" >&2; exit 2; }
      measure "$config" --theta "$THETA" --policy "$config" --local-window "$LW" "${rule[@]}" ;;
    *) echo "unknown configuration '$config' (dense, sparse, offload)" >&2; exit 2 ;;
  esac
  PORT=$((PORT + 1))
done
