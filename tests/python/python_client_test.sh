#!/usr/bin/env bash
# Starts the real server on free loopback ports and streams a completion with the Python
# example client, in a virtualenv with grpcio and grpcio-tools from PyPI (what a user installs).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$1"
venv="$root/build/python-example-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc_tools, grpc' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$root/examples/python/requirements.txt"
fi
py="$venv/bin/python"
port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
"$bin" serve --model "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --host 127.0.0.1 \
  --port "$port" --metrics-port "$mport" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q "serving thetaserve" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "server died"; exit 1; }
  sleep 0.2
done
out=$($py "$root/examples/python/client.py" --addr "127.0.0.1:$port" \
  --prompt "The capital of France is" --max-tokens 12)
echo "client output: $out"
[ -n "$(echo "$out" | tr -d '[:space:]')" ] || { echo "empty completion"; exit 1; }
kill -TERM $pid
wait $pid
echo "python client test: passed"
