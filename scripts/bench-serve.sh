#!/usr/bin/env bash
# Serving benchmark of thetaserve (issue 8): starts `thetaserve serve` on loopback once per
# configuration, sweeps the load with bench/serve/sweep.py (vLLM-style metrics: TTFT, TPOT,
# ITL, E2E, throughput, goodput), writes JSON under the results directory, stops the server and
# draws the throughput-vs-latency plot.
#
#   scripts/bench-serve.sh                       # short-prompt mix, default flags, C = 1,8,32,64
#   scripts/bench-serve.sh --mix long --config "dense=--kv-cache-memory 64M" \
#       --config "sparse=--kv-cache-memory 64M --theta thetas.json --policy sparse" \
#       --request-rate 0.1,0.2,0.4 \
#       -- --goodput ttft:10000
#
# Flags (all optional):
#   --results DIR        where the JSON, logs and dataset go (default build/bench-serve/<mix>)
#   --mix short|long|shared   short: ~128 input tokens, 64 output tokens (default);
#                        long: 2048-7936 input tokens, 32 output tokens;
#                        shared: one ~512-token preamble + ~64 tokens each, 32 output tokens
#                        (for --config "on=" --config "off=--prefix-caching off")
#   --config NAME=FLAGS  a server configuration: FLAGS are added to `thetaserve serve`
#                        (repeatable; default "default=" = the server's default flags)
#   --concurrency LIST   closed-loop points (default 1,8,32,64 unless --request-rate is given)
#   --request-rate LIST  open-loop Poisson points in req/s (e.g. 0.5,1,2,inf)
#   --plot PNG           where the plot goes (default RESULTS/thetaserve.png)
#   -- ARGS              passed to sweep.py / bench_serve.py as they are (e.g. --num-prompts,
#                        --prompts-per-concurrency, --input-len, --output-len, --goodput)
# Env: THETASERVE_BIN (default build/thetaserve; built with scripts/build.sh when missing).
# Only loopback addresses are used; every request loop is bounded by the number of prompts.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

mix=short
results=""
plot=""
configs=()
concurrency=""
rate=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --results) results="$2"; shift 2 ;;
    --mix) mix="$2"; shift 2 ;;
    --config) configs+=("$2"); shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --request-rate) rate="$2"; shift 2 ;;
    --plot) plot="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "bench-serve: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$mix" in
  short) mix_args=(--input-len 128 --output-len 64 --ignore-eos) ;;
  long) mix_args=(--input-len 2048:7936 --output-len 32 --ignore-eos) ;;
  shared) mix_args=(--shared-prefix-len 512 --input-len 64 --output-len 32 --ignore-eos) ;;
  *) echo "bench-serve: --mix short|long|shared" >&2; exit 2 ;;
esac
[ ${#configs[@]} -gt 0 ] || configs=("default=")
if [ -z "$concurrency" ] && [ -z "$rate" ]; then concurrency="1,8,32,64"; fi
results="${results:-$root/build/bench-serve/$mix}"
plot="${plot:-$results/thetaserve.png}"

# Python environment (PyPI packages, like tests/python/python_client_test.sh).
py="$(bash "$root/scripts/bench-serve-venv.sh")"

# Model, corpora, binary.
[ -f "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] || bash "$root/scripts/fetch-model.sh"
ls "$root"/data/*.txt >/dev/null 2>&1 || bash "$root/scripts/fetch-corpora.sh"
bin="${THETASERVE_BIN:-$root/build/thetaserve}"
if [ ! -x "$bin" ]; then
  bash "$root/scripts/build.sh"
fi

args=(--backend thetaserve --server-bin "$bin" --model "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
      --results-dir "$results" "${mix_args[@]}")
for c in "${configs[@]}"; do args+=(--config "$c"); done
[ -z "$concurrency" ] || args+=(--concurrency "$concurrency")
[ -z "$rate" ] || args+=(--request-rate "$rate")

echo "bench-serve: $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), results -> $results"
"$py" "$root/bench/serve/sweep.py" "${args[@]}" "${extra[@]}"
"$py" "$root/bench/serve/plot.py" "$results"/thetaserve-*.json --out "$plot" \
  --title "thetaserve, $mix-prompt mix ($(nproc) CPUs)"
echo "bench-serve: done -> $results"
