#!/usr/bin/env bash
# Barrier-removal sweep on the CUDA emulator: removes each __syncthreads() of kernels/cuda in
# turn (in a copy of the checkout, never in it), rebuilds the emulated attention and ops tests,
# and runs them with every block in thread-index order (THETASERVE_EMU_ORDER=forward) and in
# the default order (every other block reversed). A barrier whose removal passes both is
# either redundant or a gap in the tests. One line per barrier on stdout; about 3 minutes a
# barrier on 2 cores.
# Usage: tests/gpu/emu/barrier-sweep.sh [WORK_DIR]   (default: a new temporary folder)
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
work="${1:-$(mktemp -d "${TMPDIR:-/tmp}/barrier-sweep.XXXXXX")}"
mkdir -p "$work/src"
(cd "$root" && git ls-files -z | tar --null -cf - -T -) | (cd "$work/src" && tar xf -)
[ -e "$root/models" ] && ln -sfn "$root/models" "$work/src/models"
cd "$work/src" || exit 1
jobs="$(nproc)"
targets=(gpu_attention_test_emu gpu_ops_test_emu)
echo "barrier-sweep: building in $work" >&2
cmake -S . -B build -DTHETASERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
  { echo "barrier-sweep: configure failed ($work/configure.log)" >&2; exit 1; }
cmake --build build -j"$jobs" --target "${targets[@]}" >"$work/build.log" 2>&1 ||
  { echo "barrier-sweep: the unmodified tree does not build ($work/build.log)" >&2; exit 1; }

run() {  # run FILE ORDER -> "attn=...,ops=..."
  local f="$1" order="$2" a=- o=-
  if [ "$f" != kernels/cuda/ops.cu ]; then
    a=pass
    THETASERVE_EMU_ORDER="$order" timeout 900 build/tests/gpu/emu/gpu_attention_test_emu \
      >"$work/run.log" 2>&1 || a=FAIL
  fi
  if [ "$f" = kernels/cuda/ops.cu ] || [ "$f" = kernels/cuda/common.cuh ]; then  # the others: attention only
    o=pass
    THETASERVE_EMU_ORDER="$order" timeout 900 build/tests/gpu/emu/gpu_ops_test_emu \
      >"$work/run.log" 2>&1 || o=FAIL
  fi
  echo "attn=$a,ops=$o"
}

files=(kernels/cuda/attention.cu kernels/cuda/split_block.cuh kernels/cuda/split_scores.cuh
       kernels/cuda/split_keep.cuh kernels/cuda/split_theta.cuh kernels/cuda/prefill.cu
       kernels/cuda/prefill_block.cuh kernels/cuda/prefill_theta.cu kernels/cuda/ops.cu
       kernels/cuda/common.cuh)
for f in "${files[@]}"; do
  n=$(grep -c "__syncthreads()" "$f")
  for i in $(seq 1 "$n"); do
    cp "$f" "$work/original"
    line=$(python3 - "$f" "$i" <<'PY'
import sys
path, k = sys.argv[1], int(sys.argv[2])
lines = open(path).read().split('\n')
seen = 0
for j, text in enumerate(lines):
    if '__syncthreads()' in text:
        seen += 1
        if seen == k:
            lines[j] = text.replace('__syncthreads()', '(void)0', 1)
            open(path, 'w').write('\n'.join(lines))
            print(j + 1)
            break
PY
)
    if cmake --build build -j"$jobs" --target "${targets[@]}" >"$work/build.log" 2>&1; then
      echo "$f:$line forward:$(run "$f" forward) alternate:$(run "$f" alternate)"
    else
      echo "$f:$line build-failed"
    fi
    cp "$work/original" "$f"
  done
done
echo "barrier-sweep: done ($work)" >&2
