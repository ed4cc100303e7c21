#!/usr/bin/env bash
# Starts the real server with the OpenAI-compatible HTTP API on free loopback ports and runs two
# independent HTTP clients against it: the official `openai` package (examples/python/
# openai_client.py --check, in a virtualenv from PyPI, as a user installs it) and the serving
# benchmark's aiohttp backend (bench/serve/bench_serve.py --backend openai).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$1"
venv="$root/build/openai-example-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$root/examples/python/requirements-openai.txt"
fi
py="$venv/bin/python"
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); mport=$(free_port); hport=$(free_port)
log=$(mktemp)
"$bin" serve --model "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --host 127.0.0.1 \
  --port "$port" --metrics-port "$mport" --http-port "$hport" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  grep -q "serving thetaserve" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "server died"; exit 1; }
  sleep 0.2
done
"$py" "$root/examples/python/openai_client.py" --base-url "http://127.0.0.1:$hport/v1" --check

bench_py="$(bash "$root/scripts/bench-serve-venv.sh")"
out=$(mktemp -d)
"$bench_py" "$root/bench/serve/bench_serve.py" --backend openai \
  --base-url "http://127.0.0.1:$hport" --model-name SmolLM2-135M-Instruct.Q4_1 \
  --addr "127.0.0.1:$port" --input-len 64 --output-len 16 --num-prompts 8 --request-rate inf \
  --ignore-eos --disable-tqdm --result-file "$out/r.json" >"$out/log" 2>&1 \
  || { cat "$out/log"; exit 1; }
"$bench_py" - "$out/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] == 8 and r["failed"] == 0, r
assert r["total_output_tokens"] == 8 * 16, r["total_output_tokens"]
print(f"bench_serve --backend openai: 8/8 requests, {r['total_output_tokens']} tokens")
PY
rm -rf "$out"
kill -TERM $pid
wait $pid
echo "openai client test: passed"
