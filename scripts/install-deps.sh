#!/usr/bin/env bash
# Installs the Debian packages thetaserve builds and tests with. Idempotent: packages already
# present are skipped by apt, and `apt-get update` runs only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates python3 python3-pip
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  prometheus yamllint python3-grpcio python3-venv docker-compose shellcheck
  bible-kjv-text r-cran-janeaustenr fortunes-min fortunes
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
