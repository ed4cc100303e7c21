#!/usr/bin/env bash
# Decodes the public-domain text corpora shipped in Debian packages into plain UTF-8 files under
# the git-ignored <repo>/data/:
#   data/kjv.txt       King James Bible, one verse per line (no "Ge1:1" references)
#                      from bible-kjv-text's /usr/lib/bible.data (LZW-compressed blocks)
#   data/austen.txt    Jane Austen's six novels (janeaustenr's R lazy-load data, decoded in
#                      Python - no R needed), lines joined with \n, novels separated by a blank
#                      line, in the order Sense and Sensibility, Pride and Prejudice, Mansfield
#                      Park, Emma, Northanger Abbey, Persuasion
#   data/fortunes.txt  all fortune files (fortunes, fortunes-min), "%" separators -> blank lines
# Idempotent: an output that exists and is newer than its package source is kept.
# Usage: scripts/fetch-corpora.sh [--force]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/data"
HELPER="$REPO/scripts/reference/corpora.py"
FORCE=0
if [ "${1:-}" = "--force" ]; then FORCE=1; fi

need_pkg() {
  if ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; then
    echo "fetch-corpora: Debian package '$1' is not installed; run scripts/install-deps.sh" >&2
    exit 1
  fi
}

find_file() {  # find_file PACKAGE REGEX -> first regular file of PACKAGE matching REGEX
  dpkg -L "$1" | grep -E "$2" | while read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; break; fi
  done
}

for p in bible-kjv-text r-cran-janeaustenr fortunes fortunes-min; do need_pkg "$p"; done
command -v python3 >/dev/null || { echo "fetch-corpora: python3 not found" >&2; exit 1; }

mkdir -p "$OUT"

KJV_SRC="$(find_file bible-kjv-text '/bible\.data$')"
AUSTEN_RDB="$(find_file r-cran-janeaustenr '/janeaustenr/data/Rdata\.rdb$')"
FORT_FILE="$(find_file fortunes-min '/fortunes/fortunes$')"
[ -n "$KJV_SRC" ] || { echo "fetch-corpora: bible.data not found in bible-kjv-text" >&2; exit 1; }
[ -n "$AUSTEN_RDB" ] || { echo "fetch-corpora: Rdata.rdb not found in r-cran-janeaustenr" >&2; exit 1; }
[ -n "$FORT_FILE" ] || { echo "fetch-corpora: fortune files not found" >&2; exit 1; }
AUSTEN_PKG="$(dirname "$(dirname "$AUSTEN_RDB")")"
FORT_DIR="$(dirname "$FORT_FILE")"

build() {  # build NAME SOURCE ARGS...
  local name="$1" src="$2"; shift 2
  local dst="$OUT/$name.txt"
  if [ "$FORCE" -eq 0 ] && [ -s "$dst" ] && [ "$dst" -nt "$src" ] && [ "$dst" -nt "$HELPER" ]; then
    echo "fetch-corpora: $name.txt up to date"
    return
  fi
  echo "fetch-corpora: decoding $name from $src ..."
  python3 -c 'import sys
sys.path.insert(0, sys.argv[1])
import corpora
which, out, src = sys.argv[2], sys.argv[3], sys.argv[4]
text = {"kjv": corpora.kjv, "austen": corpora.austen, "fortunes": corpora.fortunes}[which](src)
open(out + ".tmp", "w", encoding="utf-8", newline="\n").write(text)
' "$(dirname "$HELPER")" "$name" "$dst" "$@"
  mv "$dst.tmp" "$dst"
}

build kjv "$KJV_SRC" "$KJV_SRC"
build austen "$AUSTEN_RDB" "$AUSTEN_PKG"
build fortunes "$FORT_FILE" "$FORT_DIR"

echo "fetch-corpora: done"
for n in kjv austen fortunes; do
  f="$OUT/$n.txt"
  printf '  %-14s %9d bytes %7d lines\n' "data/$n.txt" "$(wc -c <"$f")" "$(wc -l <"$f")"
done
