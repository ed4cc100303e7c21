#!/usr/bin/env bash
# Starts the real server on free loopback ports and streams a completion with the Python
# example client, in a virtualenv with grpcio and grpcio-tools from PyPI (what a user installs).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$1"
# shellcheck source=tests/python/lib.sh
. "$root/tests/python/lib.sh"
venv="$root/build/python-example-venv"
ensure_venv "$venv" "$root/examples/python/requirements.txt" grpc_tools grpc
py="$venv/bin/python"
port=$(free_port)
start_server "$bin" --port "$port" --metrics-port "$(free_port)"
out=$($py "$root/examples/python/client.py" --addr "127.0.0.1:$port" \
  --prompt "The capital of France is" --max-tokens 12)
echo "client output: $out"
[ -n "$(echo "$out" | tr -d '[:space:]')" ] || { echo "empty completion"; exit 1; }
stop_server
echo "python client test: passed"
