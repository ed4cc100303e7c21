#!/usr/bin/env bash
# Shared libraries for the runtime image, without -dev packages and without naming
# version-suffixed runtime packages (libgrpc++1.51, libprotobuf32, ...) that differ between
# Debian and Ubuntu releases.
#
#   collect-libs.sh BINARY DIR   (build stage) copy every library ldd resolves for BINARY into
#                                DIR, except the C library and loader and the GPU driver's
#                                libraries (libcuda, libnvidia-*: the NVIDIA container runtime
#                                mounts them from the host)
#   collect-libs.sh --prune DIR  (runtime stage) delete from DIR the libraries the image already
#                                has (by soname, from the ldconfig cache), so registering DIR
#                                with ldconfig shadows nothing the system (python3, apt) uses
#   collect-libs.sh --verify BINARY
#                                fail when ldd cannot resolve a library of BINARY
set -euo pipefail

verify() {
  local missing
  # The GPU driver's libraries are mounted at run time by the NVIDIA container runtime.
  missing=$(ldd "$1" | grep 'not found' | grep -vE '^\s*(libcuda\.so|libnvidia-)' || true)
  if [ -n "$missing" ]; then
    echo "collect-libs: unresolved libraries of $1:" >&2
    echo "$missing" >&2
    exit 1
  fi
}

case "${1:-}" in
  --prune)
    dir="$2"
    have=$(ldconfig -p | awk 'NR > 1 {print $1}' | sort -u)
    kept=0
    removed=0
    for f in "$dir"/*; do
      [ -e "$f" ] || continue
      if grep -qxF "$(basename "$f")" <<<"$have"; then
        rm -f "$f"
        removed=$((removed + 1))
      else
        kept=$((kept + 1))
      fi
    done
    echo "collect-libs: kept $kept libraries in $dir ($removed already in the image)"
    ;;
  --verify)
    verify "$2"
    echo "collect-libs: every library of $2 resolves"
    ;;
  *)
    bin="$1"
    dest="$2"
    verify "$bin"
    mkdir -p "$dest"
    n=0
    while read -r lib; do
      base="$(basename "$lib")"
      case "$base" in
        ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) continue ;;
        libcuda.so*|libnvidia-*|libnvcuvid*|libnvoptix*) continue ;;
      esac
      cp -L "$lib" "$dest/$base"
      n=$((n + 1))
    done < <(ldd "$bin" | awk '/=> \// {print $3}' | sort -u)
    echo "collect-libs: copied $n libraries into $dest"
    ;;
esac
