#!/usr/bin/env bash
# Integration test of the monitoring stack (ctest: deploy_promql), on loopback only:
#  1. starts the real server through the image's entrypoint (deploy/docker/entrypoint.sh, with
#     THETASERVE_FLAG_* variables as compose and the chart set them, and
#     THETASERVE_FETCH_MODEL=always: scripts/fetch-model.sh checks the model CI fetched) on
#     free 127.0.0.1 ports with the default model, and waits for the image's HEALTHCHECK
#     (`entrypoint.sh health`, the gRPC health service) to say SERVING;
#  2. starts Debian's prometheus with a temporary storage folder and a config derived from
#     deploy/prometheus/prometheus.yml (target rewritten to the server, 1 s intervals, the
#     rules of deploy/k8s/thetaserve/rules loaded);
#  3. sends requests with `thetaserve client` (sequential and concurrent);
#  4. evaluates every PromQL expression of every dashboard panel and variable, every recording
#     and alert rule, and the prometheus-adapter queries through Prometheus' HTTP API and
#     asserts each returns data (tests/deploy/promql_check.py; alert conditions are split at
#     their comparisons, which are empty while the alerts do not fire);
#  5. sends SIGTERM and checks the server drains and exits 0 (what the chart's preStop and
#     terminationGracePeriodSeconds rely on).
# With --top-theta (ctest: deploy_promql_top_theta) the server runs Top-θ attention with the
# sparse V policy instead of dense attention: a θ file is calibrated first (`thetaserve
# calibrate` on the repository's docs, a few seconds), the tail and observation windows are
# short so that rows leave the dense tail within these short requests, the concurrent requests
# are long enough to be running across scrapes, and step 4 also asserts the memory-savings
# ratios are finite and below 1 (promql_check.py --savings).
# Everything is bounded in time; both processes are stopped on exit.
# Usage: promql_integration.sh THETASERVE_BINARY [--top-theta]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$(cd "$(dirname "${1:?usage: promql_integration.sh THETASERVE_BINARY}")" && pwd)/$(basename "$1")"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
top_theta=0
case "${2:-}" in
  "") ;;
  --top-theta) top_theta=1 ;;
  *) echo "usage: promql_integration.sh THETASERVE_BINARY [--top-theta]" >&2; exit 2 ;;
esac
for tool in prometheus promtool python3; do
  command -v "$tool" >/dev/null || { echo "promql_integration: $tool not found (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -f "$model" ] || { echo "promql_integration: $model missing (scripts/fetch-model.sh)" >&2; exit 1; }
python3 -c 'import yaml' 2>/dev/null || { echo "promql_integration: python3 lacks PyYAML (python3-yaml)" >&2; exit 1; }
# The health check needs a python with grpc (Debian's python3-grpcio, as in the image).
health_py=""
for py in /usr/bin/python3 python3; do
  if "$py" -c 'import grpc' 2>/dev/null; then health_py="$py"; break; fi
done
[ -n "$health_py" ] || { echo "promql_integration: no python3 with grpc (python3-grpcio)" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/thetaserve-promql.XXXXXX")"
server_pid=""
prom_pid=""
stop() {  # stop PID NAME: TERM, up to 15 s, then KILL
  local pid="$1"
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop "$prom_pid"
  stop "$server_pid"
  if [ "$rc" -ne 0 ]; then
    echo "--- server log"; tail -n 30 "$work/server.log" 2>/dev/null || true
    echo "--- prometheus log"; tail -n 30 "$work/prometheus.log" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); mport=$(free_port); pport=$(free_port)
while [ "$mport" = "$port" ]; do mport=$(free_port); done
while [ "$pport" = "$port" ] || [ "$pport" = "$mport" ]; do pport=$(free_port); done
hport=$(free_port)  # the HTTP API, on as the chart runs it (its connection series are real)
while [ "$hport" = "$port" ] || [ "$hport" = "$mport" ] || [ "$hport" = "$pport" ]; do
  hport=$(free_port)
done

server_env=(
  THETASERVE_HOME="$root" THETASERVE_BIN="$bin" THETASERVE_MODEL="$model"
  THETASERVE_FETCH_MODEL=always THETASERVE_PYTHON="$health_py"
  THETASERVE_FLAG_HOST=127.0.0.1 THETASERVE_FLAG_PORT="$port" THETASERVE_FLAG_METRICS_PORT="$mport"
  THETASERVE_FLAG_HTTP_PORT="$hport"
  THETASERVE_FLAG_THREADS=1 THETASERVE_FLAG_KV_CACHE_MEMORY=64M THETASERVE_FLAG_MAX_NUM_SEQS=4
  THETASERVE_FLAG_DRAIN_TIMEOUT=20
)
gen_tokens=16   # the concurrent requests' max tokens
check_flags=()
if [ "$top_theta" = 1 ]; then
  echo "== 0. θ file: thetaserve calibrate on the repository's docs"
  cat "$root"/docs/*.md "$root/README.md" >"$work/corpus.txt"
  # (grep -v exits 1 when it prints nothing: calibrate's own status is what counts.)
  if ! "$bin" calibrate --model "$model" --corpus "$work/corpus.txt" --k 8 --dense-layers 1 \
      --context 256 --max-tokens 1024 --out "$work/theta.json" 2>&1 |
      tr '\r' '\n' | { grep -v '^calibrating' || true; }; then
    echo "calibrate failed"
    exit 1
  fi
  [ -s "$work/theta.json" ] || { echo "calibration wrote no θ file"; exit 1; }
  server_env+=(THETASERVE_FLAG_THETA="$work/theta.json" THETASERVE_FLAG_POLICY=sparse
               THETASERVE_FLAG_LOCAL_WINDOW=16 THETASERVE_FLAG_OBS_WINDOW=4)
  gen_tokens=160
  check_flags=(--savings)
fi

echo "== 1. server through deploy/docker/entrypoint.sh on 127.0.0.1:$port (metrics :$mport)"
env "${server_env[@]}" bash "$root/deploy/docker/entrypoint.sh" serve >"$work/server.log" 2>&1 &
server_pid=$!
healthy=0
for _ in $(seq 1 240); do  # up to ~120 s (model checksum, load, warm-up)
  kill -0 "$server_pid" 2>/dev/null || { echo "server exited"; exit 1; }
  if env "${server_env[@]}" bash "$root/deploy/docker/entrypoint.sh" health >"$work/health.txt" 2>&1; then
    healthy=1; break
  fi
  sleep 0.5
done
[ "$healthy" = 1 ] || { cat "$work/health.txt"; echo "server never reported SERVING"; exit 1; }
cat "$work/health.txt"
grep -E "^entrypoint: exec|fetch-model:" "$work/server.log" | sed 's/^/  /'

echo "== 2. prometheus on 127.0.0.1:$pport"
python3 "$root/tests/deploy/promql_check.py" config "$root" "127.0.0.1:$mport" "127.0.0.1:$pport" "$work/prometheus.yml"
promtool check config "$work/prometheus.yml"
mkdir -p "$work/data"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$work/prometheus.log" 2>&1 &
prom_pid=$!
ready=0
for _ in $(seq 1 300); do  # up to ~30 s
  kill -0 "$prom_pid" 2>/dev/null || { echo "prometheus exited"; exit 1; }
  if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
      "http://127.0.0.1:$pport/-/ready" 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" = 1 ] || { echo "prometheus never became ready"; exit 1; }
echo "prometheus ready"
# A couple of scrapes before the traffic, so rates have a baseline.
python3 "$root/tests/deploy/promql_check.py" wait-scraped "http://127.0.0.1:$pport"

echo "== 3. requests"
client() { timeout 60 "$bin" client --addr "127.0.0.1:$port" --timeout 50 "$@"; }
n=0
for prompt in "The capital of France is" "Once upon a time" "The three primary colours are"; do
  n=$((n + 1)); client --prompt "$prompt" --max-tokens 12 >"$work/client.$n.txt" 2>&1
done
pids=()
for i in 1 2 3 4 5 6; do  # more than --max-num-seqs 4: some wait
  n=$((n + 1)); client --prompt "Count to ten: $i," --max-tokens "$gen_tokens" --ignore-eos \
    >"$work/client.$n.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
n=$((n + 1)); client --chat --prompt "Say hello." --max-tokens 8 --stop "." >"$work/client.$n.txt" 2>&1
finished=$(cat "$work"/client.*.txt | grep -o 'finish: [a-z]*' | sort | uniq -c | tr -s ' ' | paste -sd, -)
echo "requests: $n sent; finish reasons:$finished"
if [ "$(cat "$work"/client.*.txt | grep -o 'finish: ' | wc -l)" -ne "$n" ]; then
  tail -n 3 "$work"/client.*.txt; echo "a request failed"; exit 1
fi
sleep 3  # scrapes after the traffic

echo "== 4. every dashboard, rule and adapter expression through /api/v1/query"
python3 "$root/tests/deploy/promql_check.py" check "$root" "http://127.0.0.1:$pport" --wait 60 \
  "${check_flags[@]}"

echo "== 5. SIGTERM: drain and exit 0"
kill -TERM "$server_pid"
rc=0
for _ in $(seq 1 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
wait "$server_pid" || rc=$?
server_pid=""
grep -E "draining|stopped" "$work/server.log" | sed 's/^/  /'
[ "$rc" -eq 0 ] || { echo "server exited $rc after SIGTERM"; exit 1; }
echo "promql_integration: passed"
