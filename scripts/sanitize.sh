#!/usr/bin/env bash
# Builds the host code under a sanitizer and runs CPU tests with it:
#   scripts/sanitize.sh address   # AddressSanitizer + LeakSanitizer + UBSan (build-asan/):
#                                 # every test but the emulated GPU ones (-LE emu; they pass
#                                 # too, in ~25 min more: `scripts/sanitize.sh address -L emu`)
#   scripts/sanitize.sh thread    # ThreadSanitizer (build-tsan/): the engine, scheduler, cache,
#                                 # thread pool, attention and HTTP server tests
# Extra arguments replace the default ctest selection. Under ASan the end-to-end tests start the
# sanitized server, so a leak at its exit or undefined behaviour in it fails the test.
# ThreadSanitizer gets no end-to-end or gRPC test by default: Debian's gRPC and Abseil are not
# built with it, so it cannot see their synchronization and reports hundreds of races inside
# them in any process that runs gRPC (measured: docs/results.md#sanitizers-2026-12-02).
# Each build takes 15–30 min on 2 cores (17 measured on a quiet machine). Needs what scripts/test.sh installs and fetches.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
shift || true
case "$kind" in
  address) dir=build-asan; flags="address,undefined" ;;
  thread) dir=build-tsan; flags="thread" ;;
  *) echo "usage: scripts/sanitize.sh address|thread [ctest arguments]" >&2; exit 2 ;;
esac
if [ $# -eq 0 ]; then
  if [ "$kind" = thread ]; then
    set -- -R '^(ThreadPoolTest|HttpServerTest|OpenAiApiTest|EngineTest|SamplerTest|PagePool[A-Za-z]*Test|SequenceKvTest|PrefixCacheTest|SchedulerTest|SplitsDecodeRowsTest|Shapes/DenseAttentionTest)\.'
  else
    set -- -LE emu
  fi
fi
echo "== configure $dir (-fsanitize=$flags)"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTHETASERVE_CUDA=OFF \
  -DTHETASERVE_SANITIZE="$flags" >/dev/null
echo "== build $dir"
cmake --build "$dir" -j"$(nproc)"
# LeakSanitizer's suppressions name only what it cannot see into (uninstrumented system
# libraries); the file says why each is there.
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="second_deadlock_stack=1"
echo "== ctest $* (under -fsanitize=$flags)"
cd "$dir"
# Sanitized code runs 2-15x slower: the per-test timeout is raised to match.
ctest --output-on-failure -j"$(nproc)" --timeout 3000 "$@"
