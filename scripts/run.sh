#!/usr/bin/env bash
# The main job on a fresh machine: installs packages, fetches the default model, builds, and
# starts the server on it (GPU when one is visible, CPU otherwise). Extra flags go to serve.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
exec build/thetaserve serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --device auto "$@"
