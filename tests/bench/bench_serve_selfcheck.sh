#!/usr/bin/env bash
# The serving benchmark's self-checks (bench/serve/test_bench_serve.py: metric definitions,
# length specs, prompt cutting, the OpenAI backend against a fake streaming server), in the
# benchmark's own virtualenv (PyPI packages from bench/serve/requirements.txt, as
# scripts/bench-serve.sh makes it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/build/bench-serve-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc_tools, grpc, aiohttp, tqdm, matplotlib, numpy' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$root/bench/serve/requirements.txt"
fi
exec "$venv/bin/python" "$root/bench/serve/test_bench_serve.py"
