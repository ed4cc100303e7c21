#!/usr/bin/env bash
# The GPU check, one command: builds with CUDA, runs the `gpu` tests (every
# kernel and the whole forward pass against the CPU reference), then the GPU benchmarks
# (copy bandwidth; decode attention dense vs Top-θ at 1k-128k context and batch 1-64;
# prefill attention TFLOP/s; end-to-end decode tokens/s on SmolLM2), and prints a short table
# last. Logs go to $OUT when it is set (else out/gpu-check/). Under 8 minutes on an H200.
# Last, the CPU decode attention benchmark on the machine's cores (a few seconds): how much
# splitting batch 1's long rows across many threads gains, which a 2-core VM cannot show.
#
#   scripts/gpu-check.sh                    # configure + build (needs scripts/install-deps.sh)
#   scripts/gpu-check.sh --prebuilt DIR     # binaries from scripts/gpu-pack.sh (DIR/bin, DIR/lib)
#   scripts/gpu-check.sh --model FILE --theta FILE[,FILE]   # defaults: models/SmolLM2…gguf, none
#   scripts/gpu-check.sh ... --ncu          # then Nsight Compute on Top-θ's kernels at 32k × 64
#   scripts/gpu-check.sh ... --deadline S   # finish within S seconds of its start (see below)
# With --deadline (a device call's limit less a margin: the call is killed at its limit, and the
# summary, printed last, would be lost with it), each step's timeout is cut to what is left
# (less 10 s for a killed step to go: timeout -k 10), and a step that would start with less
# than its minimum left is skipped; both said in the log and the summary ("skipped", "cut
# short"). A test binary needs 30 s and leaves 150 s for the benchmark; the optional steps
# after it (512-key chunks, the CPU attention, each Nsight Compute read, most telling first)
# need 60, 40 and 60 s and may run up to 120, 60 and 90.
# Files under $OUT (the device tool brings back 8): device.txt, tests.log (every test's output),
# gpu-bench.log, gpu-bench-chunk512.log, cpu-attention.log, ncu.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
prebuilt="" model="models/SmolLM2-135M-Instruct.Q4_1.gguf" theta="" quick=0 only_model=0 ncu=0
deadline=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --theta) theta=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --only-model) only_model=1; shift ;;  # just the model's forward test and decode benchmark
    --ncu) ncu=1; shift ;;
    --deadline) deadline=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[[ "$deadline" =~ ^[0-9]+$ ]] || { echo "--deadline takes whole seconds, not '$deadline'" >&2; exit 2; }
out=${OUT:-$root/out/gpu-check}
mkdir -p "$out"
logs=$(mktemp -d)  # each test's log, joined into $out/tests.log
trap 'rm -rf "$logs"' EXIT
: >"$out/tests.log"
start=$(date +%s)
stamp() { echo "[gpu-check +$(( $(date +%s) - start ))s] $*"; }
# left [KEEP]: seconds of the deadline left after KEEP more and a killed step's 10 s of grace.
left() { echo $((deadline - ($(date +%s) - start) - ${1:-0} - 10)); }
# limit WANT [KEEP]: WANT seconds, or what the deadline leaves after KEEP (at least 1: timeout 0
# would mean none).
limit() {
  local want=$1 l
  [ "$deadline" -gt 0 ] || { echo "$want"; return; }
  l=$(left "${2:-0}")
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 1 ] && want=1
  echo "$want"
}
left_out=() cut_short=()
# fits NAME NEED [KEEP]: whether a step that needs NEED seconds (and leaves KEEP) still starts;
# if not, says it is skipped.
fits() {
  [ "$deadline" -gt 0 ] || return 0
  local l
  l=$(left "${3:-0}")
  [ "$l" -ge "$2" ] && return 0
  [ "$l" -lt 0 ] && l=0
  stamp "skipped $1: $l s left of the deadline, it needs $2"
  left_out+=("$1")
  return 1
}
# ended NAME RC: notes a step its timeout stopped (rc 124, or 137 after the grace).
ended() {
  if [ "$2" = 124 ] || [ "$2" = 137 ]; then
    stamp "$1: stopped by its time limit (rc $2)"
    cut_short+=("$1")
  fi
}

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee "$out/device.txt"

if [ -n "$prebuilt" ]; then
  bin="$prebuilt/bin"
  # cuBLAS comes from the machine (the CUDA toolkit or the nvidia-cublas wheel PyTorch uses).
  cublas=$(ldconfig -p 2>/dev/null | awk '/libcublas.so.13 /{print $NF; exit}')
  [ -z "$cublas" ] && cublas=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -z "$cublas" ] && cublas=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null | xargs -I{} find {} -name 'libcublas.so.13*' 2>/dev/null | head -1)
  stamp "prebuilt binaries in $bin; cuBLAS: ${cublas:-not found}"
  export LD_LIBRARY_PATH="$root/$prebuilt/lib:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}"
  export THETASERVE_SOURCE_DIR="$root"
  bin="$root/$bin"
else
  stamp "configure + build (CUDA, sm_90)"
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  # shellcheck disable=SC2015  # either step failing shows the log and stops
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTHETASERVE_CUDA=ON >"$out/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target gpu_ops_test gpu_attention_test gpu_forward_test \
      device_batch_test gpu_engine_test thetaserve_gpu_bench thetaserve_attention_bench >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  bin="$root/build-gpu/tests"
  cp build-gpu/thetaserve_gpu_bench build-gpu/thetaserve_attention_bench build-gpu/tests/ 2>/dev/null
fi

declare -A result
failed=0
prefill_fallback=""
tests=(gpu_ops_test device_batch_test gpu_attention_test gpu_forward_test gpu_engine_test)
filter='*'
if [ "$only_model" = 1 ]; then tests=(gpu_forward_test); filter='*SmolLM2*'; fi
# The attention tests run every way of reading K, and Top-θ's passes split and fused,
# themselves; SmolLM2's forward tests run once more with staged K, once per quad
# (THETASERVE_ATTN_K_LOAD=staged|quad, "name:staged" below; the tiny models' d 16 heads read K
# per thread either way) and once with the passes fused (THETASERVE_ATTN_THETA=fused).
[ -f "$model" ] && tests+=(gpu_forward_test:staged gpu_forward_test:quad gpu_forward_test:fused)
for t in "${tests[@]}"; do
  if ! fits "test $t" 30 150; then
    result[$t]="skipped: the deadline"
    continue
  fi
  stamp "test $t"
  name=${t%%:*} log="$logs/${t/:/-}.log" env=()
  f=$filter
  if [ "$t" != "$name" ]; then
    f='*SmolLM2*'
    case "${t#*:}" in
      fused) env=(THETASERVE_ATTN_THETA=fused) ;;
      *) env=("THETASERVE_ATTN_K_LOAD=${t#*:}") ;;
    esac
  fi
  # (gpu_attention_test took 116 s on the H200 host on 2026-12-04 with 27 cases, most of it the
  # CPU reference; it has 104 now — every Top-θ case as the server picks the passes, split and
  # fused — so it runs as GPU_CHECK_SHARDS gtest shards at once, 4 by default, each under the
  # limit.) The console shows failures and totals (the log has every line); awk, not head, so
  # the pipe stays open to the end.
  shards=1
  [ "$name" = gpu_attention_test ] && shards=${GPU_CHECK_SHARDS:-4}
  pids=()
  for ((s = 0; s < shards; ++s)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s timeout -k 10 "$(limit "${GPU_CHECK_TEST_TIMEOUT:-360}" 150)" \
      env "${env[@]}" stdbuf -oL -eL "$bin/$name" --gtest_color=no --gtest_filter="$f" \
      >"$log.$s" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do
    wait "$pid" || rc=$?
  done
  ended "test $t" "$rc"
  for ((s = 0; s < shards; ++s)); do cat "$log.$s"; done >"$log"
  grep -E '^\[ +(FAILED|SKIPPED|PASSED) +\]|^\[==========\]|Failure|error|THETASERVE_SEED' "$log" | awk 'NR <= 60'
  passed=$(grep -c '^\[       OK \]' "$log")
  fails=$(grep -c '^\[  FAILED  \] .* ms)$' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] .* ms)$' "$log")
  result[$t]="rc $rc: $passed passed, $fails failed, $skipped skipped"
  [ "$rc" -ne 0 ] && failed=1
  { echo "==== $t (rc $rc)"; cat "$log"; } >>"$out/tests.log"
  # The default prefill kernels (dense and Top-θ) rest on the fragment layouts
  # kernels/cuda/warp_mma.cuh writes down. If the probe of its instructions does not pass
  # (failed, or the binary died first), what runs the default ways from then on (the forward
  # and engine tests, the end-to-end benchmark; the attention tests and the prefill table name
  # their kernels) takes the wmma kernel for dense prefill and the split kernels for Top-θ's,
  # said here and in the summary, so the decode figures still come back; the failure stays
  # one. A way the caller set is kept.
  probe=GpuOpsTest.WarpMmaAndLdmatrixFollowTheirLayouts
  if [ "$name" = gpu_ops_test ] && ! grep -qE "^\[ +(OK|SKIPPED) +\] $probe " "$log"; then
    prefill_fallback="the warp_mma probe did not pass:"
    if [ "${THETASERVE_ATTN_PREFILL:-mma}" = mma ]; then
      prefill_fallback+=" THETASERVE_ATTN_PREFILL=wmma"
      export THETASERVE_ATTN_PREFILL=wmma
    else
      prefill_fallback+=" THETASERVE_ATTN_PREFILL=$THETASERVE_ATTN_PREFILL kept"
    fi
    if [ "${THETASERVE_ATTN_THETA_PREFILL:-tiled}" = tiled ]; then
      prefill_fallback+=", THETASERVE_ATTN_THETA_PREFILL=split from then on"
      export THETASERVE_ATTN_THETA_PREFILL=split
    else
      prefill_fallback+=", THETASERVE_ATTN_THETA_PREFILL=$THETASERVE_ATTN_THETA_PREFILL kept"
    fi
    stamp "$prefill_fallback"
  fi
done

stamp "benchmarks"
args=(--model "$model")
[ -n "$theta" ] && args+=(--theta "$theta")
[ "$only_model" = 1 ] && args+=(--contexts "" --prefill "" --offload-contexts "")
# shellcheck disable=SC2054  # the lists are the flags' comma-separated values
[ "$quick" = 1 ] && args+=(--contexts 1024,32768 --batches 1,32 --prefill 4096 --offload-contexts 32768 --offload-batches 8 --e2e-batches 1,32 --e2e-long-batches 8 --repeats 3)
timeout -k 10 "$(limit 300 5)" "$bin/thetaserve_gpu_bench" "${args[@]}" 2>&1 | tee "$out/gpu-bench.log"
bench_rc=${PIPESTATUS[0]}
ended "benchmark" "$bench_rc"
if [ "$only_model" = 0 ] && [ "$bench_rc" = 0 ] && fits "512-key chunks" 60; then
  # The planned chunk at 32k is 1024 keys from batch 8 on; staged K then fits 5 blocks per SM
  # (37.6 KB of shared memory each at SmolLM2's shape), at 512-key chunks 6 (its registers):
  # measure both.
  stamp "decode attention at 512-key chunks"
  THETASERVE_ATTN_CHUNK=512 timeout -k 10 "$(limit 120)" "$bin/thetaserve_gpu_bench" --contexts 32768 --batches 8,64 \
    --prefill "" --offload-contexts "" --model "" --v-target 0 --repeats 5 2>&1 | tee "$out/gpu-bench-chunk512.log" | sed -n '/^## decode/,/^$/p'
  ended "512-key chunks" "${PIPESTATUS[0]}"
fi

if [ "$only_model" = 0 ] && [ -x "$bin/thetaserve_attention_bench" ] && fits "CPU attention" 40; then
  stamp "CPU decode attention, all cores (split÷: whole rows' time over split rows')"
  timeout -k 10 "$(limit 60)" "$bin/thetaserve_attention_bench" --kv-dtype f16 --contexts 4096,32768 --repeats 9 \
    2>&1 | tee "$out/cpu-attention.log"
  ended "CPU attention" "${PIPESTATUS[0]}"
fi

# Nsight Compute on Top-θ's kernels at 32k × 64, K staged and per quad, two kernels and fused,
# and one pass (staged). Of the launches the filter matches, the benchmark first makes 43 (the
# post-softmax V rows read: pass 1, pass 2, combine; then 20 bisection steps of the pre-softmax
# θ, a one-pass kernel and its combine each), then runs, per way v, dense (a warm-up and 5
# timed runs of pass 1 + combine: 12 launches), Top-θ (6 runs of pass 1, pass 2, combine: 18),
# fused (6 runs of the fused kernel and combine: 12) and one pass (12): Top-θ's first run of
# way v starts at 43 + 54·v + 12, fused's at 43 + 54·v + 30, one pass's at 43 + 54·v + 42 (the
# by-kernel runs at 32k follow all three ways' full runs).
if [ "$ncu" = 1 ] && [ "$only_model" = 0 ]; then
  # shellcheck disable=SC2012  # the first of a glob that may match nothing
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$ncu_bin" ]; then
    stamp "Nsight Compute: Top-θ at 32k × 64 ($ncu_bin)"
    # Staged and quad (per thread's profile is in docs/gpu/2026-12-04-h200-ncu.txt), the
    # server's way at 32k × 64 (staged: auto's pick there) first: two kernels, one pass, fused.
    for run in "1 12 3" "1 42 2" "1 30 2" "2 12 3" "2 30 2"; do
      read -r v first count <<<"$run"
      case "$first" in 12) what="two kernels" ;; 30) what="fused" ;; *) what="one pass" ;; esac
      fits "Nsight Compute K way $v, $what" 60 >&2 || continue
      echo "==== K way $v (0 per thread, 1 staged, 2 quad), $what"
      timeout -k 10 "$(limit 90)" "$ncu_bin" --clock-control none \
        --kernel-name regex:'SplitPass|SplitFused|SplitOnePass|Combine' \
        --launch-skip $((43 + 54 * v + first)) --launch-count "$count" --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters \
        "$bin/thetaserve_gpu_bench" --contexts 32768 --batches 64 --repeats 1 --prefill "" \
        --offload-contexts "" --model "" --v-target 0 2>&1
      ended "Nsight Compute K way $v, $what" "$?" >&2
    done >"$out/ncu.txt"
    grep -E '^  void|Duration|DRAM Throughput|Compute \(SM\)' "$out/ncu.txt" | sed -E 's/\([^()]*SplitArgs\).*//'
  else
    stamp "Nsight Compute: ncu not found"
  fi
fi

# A decode step whose graph cannot be captured falls back to direct launches and still passes:
# say so, and fail the check, rather than let the fallback hide it.
graph_failures=$(grep -l "CUDA graph capture failed" "$out"/*.log 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')
[ -n "$graph_failures" ] && failed=1

stamp "done"
echo
echo "== gpu-check summary ($(head -2 "$out/device.txt" | tail -1)) =="
for t in "${tests[@]}"; do printf '%-24s %s\n' "$t" "${result[$t]}"; done
printf '%-24s rc %s\n' "thetaserve_gpu_bench" "$bench_rc"
[ -n "$graph_failures" ] && printf '%-24s %s\n' "CUDA graph capture" "FAILED in $graph_failures"
[ -n "$prefill_fallback" ] && printf '%-24s %s\n' "mma prefill" "$prefill_fallback"
[ "${#left_out[@]}" -gt 0 ] && printf '%-24s %s\n' "skipped (deadline ${deadline} s)" "$(IFS=';'; echo "${left_out[*]}")"
[ "${#cut_short[@]}" -gt 0 ] && printf '%-24s %s\n' "cut short (time limit)" "$(IFS=';'; echo "${cut_short[*]}")"
sed -n '/^## summary/,$p' "$out/gpu-bench.log" | tail -n +2
[ "$failed" = 0 ] && [ "$bench_rc" = 0 ]
