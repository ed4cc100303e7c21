#!/usr/bin/env bash
# Makes (once) the serving benchmark's virtualenv, build/bench-serve-venv, with the PyPI
# packages of bench/serve/requirements.txt, and prints its python. Used by
# scripts/bench-serve*.sh and the bench_serve_selfcheck and python_openai_client tests. Callers
# running at once (ctest -j) take turns: two pip installs into one venv break each other.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/build/bench-serve-venv"
mkdir -p "$root/build"
exec 9>"$root/build/.bench-serve-venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc_tools, grpc, aiohttp, tqdm, matplotlib, numpy' 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q -r "$root/bench/serve/requirements.txt" >&2
fi
echo "$venv/bin/python"
