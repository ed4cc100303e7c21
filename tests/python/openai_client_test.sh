#!/usr/bin/env bash
# Starts the real server with the OpenAI-compatible HTTP API on free loopback ports and runs two
# independent HTTP clients against it: the official `openai` package (examples/python/
# openai_client.py --check, in a virtualenv from PyPI, as a user installs it) and the serving
# benchmark's aiohttp backend (bench/serve/bench_serve.py --backend openai).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$1"
# shellcheck source=tests/python/lib.sh
. "$root/tests/python/lib.sh"
venv="$root/build/openai-example-venv"
ensure_venv "$venv" "$root/examples/python/requirements-openai.txt" openai
py="$venv/bin/python"
port=$(free_port); hport=$(free_port)
start_server "$bin" --port "$port" --metrics-port "$(free_port)" --http-port "$hport"
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
stop_server
echo "openai client test: passed"
