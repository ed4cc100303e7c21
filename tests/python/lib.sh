# Sourced by the Python client tests: a virtualenv from a requirements file, and the real server
# on free loopback ports, waited for until it serves, killed on exit if the test fails.
# shellcheck shell=bash
lib_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# ensure_venv VENV REQUIREMENTS MODULE...: makes VENV (once) with the packages, so that the
# modules import.
ensure_venv() {
  local venv="$1" reqs="$2"
  shift 2
  local modules
  modules=$(IFS=,; echo "$*")
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import $modules" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$reqs"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_server BIN FLAG...: `BIN serve` on the default model, on 127.0.0.1 with the given flags;
# sets server_pid and returns once it serves (exits 1, with its log, if it dies first or does
# not serve within 180 s, as the C++ tests' ServerProcess waits).
start_server() {
  local bin="$1"
  shift
  server_log=$(mktemp)
  "$bin" serve --model "$lib_root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --host 127.0.0.1 "$@" \
    >"$server_log" 2>&1 &
  server_pid=$!
  trap 'kill $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true; rm -f "$server_log"' EXIT
  for _ in $(seq 1 900); do
    grep -q "serving thetaserve" "$server_log" && return 0
    kill -0 "$server_pid" 2>/dev/null || { cat "$server_log"; echo "server died"; exit 1; }
    sleep 0.2
  done
  cat "$server_log"
  echo "the server did not serve within 180 s"
  exit 1
}

# stop_server: SIGTERM, and the server must exit 0 (set -e).
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid"
}
