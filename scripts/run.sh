#!/usr/bin/env bash
# The main job on a fresh machine: installs packages, fetches the default model, builds, and
# starts the server on it (GPU when one is visible, CPU otherwise): gRPC on :50051, the
# OpenAI-compatible HTTP API on :8000, /metrics on :9090. Extra flags go to serve (a repeated
# flag takes its last value: --http-port 0 turns the HTTP API off).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
exec build/thetaserve serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --device auto \
  --http-port 8000 "$@"
