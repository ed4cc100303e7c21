#!/usr/bin/env bash
# The serving benchmark's self-checks (bench/serve/test_bench_serve.py: metric definitions,
# length specs, prompt cutting, the OpenAI backend against a fake streaming server), in the
# benchmark's own virtualenv (scripts/bench-serve-venv.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
exec "$(bash "$root/scripts/bench-serve-venv.sh")" "$root/bench/serve/test_bench_serve.py"
