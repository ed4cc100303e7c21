#!/usr/bin/env bash
# The test command: sets up a fresh machine (packages, model, corpora), builds, runs every test.
# GPU tests (label gpu) skip themselves when no device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/fetch-corpora.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 1200
