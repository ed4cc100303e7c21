#!/usr/bin/env bash
# The peer half of the serving benchmark (issue 8): llama.cpp on the same machine, model file
# and prompts as scripts/bench-serve.sh, through the PyPI package llama-cpp-python (pinned).
# Nothing of the peer is committed: its source, build and virtualenv live in the git-ignored
# build/bench-peer/ (delete it, or pass --clean, to start over).
#
# Two peers can be run (--peer):
#   llama-server (default)  llama.cpp's own C++ OpenAI-compatible server, built from the
#                           llama.cpp source that the llama-cpp-python sdist vendors (pip
#                           download --no-binary, then CMake: CPU, -march=native, target
#                           llama-server only). It has parallel slots and continuous batching,
#                           so it is the like-for-like peer of a continuous-batching server.
#   llama-cpp-python        the package's own Python server (`pip install
#                           llama-cpp-python[server]`, compiled from source with CMake). It has
#                           no parallel slots: a global lock runs one request at a time (and by
#                           default a new request interrupts the running stream, which is turned
#                           off here with --interrupt_requests false). Slow at concurrency > 1 by
#                           design; measured for completeness.
# Settings recorded in the JSON: slots = --slots (default 64 = thetaserve's --max-num-seqs),
# threads = --threads (default nproc = thetaserve's default), context = slots x ctx-per-slot.
#
#   scripts/bench-serve-peer.sh                     # llama-server, short mix, C = 1,8,32,64
#   scripts/bench-serve-peer.sh --peer llama-cpp-python --concurrency 1,8
#
# Flags: --peer NAME, --results DIR (default build/bench-serve/<mix>, shared with bench-serve.sh
# so both use RESULTS/dataset.json), --mix short|long, --concurrency LIST, --request-rate LIST,
# --slots N, --ctx-per-slot N (default 512), --threads N, --plot PNG, --clean, -- ARGS (to
# sweep.py). When RESULTS/dataset.json is missing it is made first with thetaserve's tokenizer
# (THETASERVE_BIN, default build/thetaserve), so both servers get byte-identical prompt text.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

LLAMA_CPP_PYTHON_VERSION=0.3.36
peer=llama-server
mix=short
results=""
plot=""
concurrency=""
rate=""
slots=64
ctx_per_slot=512
threads=$(nproc)
clean=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --peer) peer="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --mix) mix="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --request-rate) rate="$2"; shift 2 ;;
    --slots) slots="$2"; shift 2 ;;
    --ctx-per-slot) ctx_per_slot="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --plot) plot="$2"; shift 2 ;;
    --clean) clean=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "bench-serve-peer: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$mix" in
  short) mix_args=(--input-len 128 --output-len 64 --ignore-eos) ;;
  long) mix_args=(--input-len 2048:7936 --output-len 32 --ignore-eos) ;;
  *) echo "bench-serve-peer: --mix short|long" >&2; exit 2 ;;
esac
if [ -z "$concurrency" ] && [ -z "$rate" ]; then concurrency="1,8,32,64"; fi
results="${results:-$root/build/bench-serve/$mix}"
plot="${plot:-$results/serving.png}"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
work="$root/build/bench-peer"
[ "$clean" = 0 ] || rm -rf "$work"
mkdir -p "$work" "$results"

# The benchmark client's environment (same as bench-serve.sh).
py="$(bash "$root/scripts/bench-serve-venv.sh")"
[ -f "$model" ] || bash "$root/scripts/fetch-model.sh"
ls "$root"/data/*.txt >/dev/null 2>&1 || bash "$root/scripts/fetch-corpora.sh"

# The same prompts as ours: made with thetaserve's tokenizer when not there yet.
if [ ! -f "$results/dataset.json" ]; then
  bin="${THETASERVE_BIN:-$root/build/thetaserve}"
  [ -x "$bin" ] || bash "$root/scripts/build.sh"
  points=()
  [ -z "$concurrency" ] || points+=(--concurrency "$concurrency")
  [ -z "$rate" ] || points+=(--request-rate "$rate")
  "$py" "$root/bench/serve/sweep.py" --backend thetaserve --server-bin "$bin" --model "$model" \
    --results-dir "$results" --dataset-only "${points[@]}" "${mix_args[@]}" "${extra[@]}"
fi

src="$work/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -d "$src/vendor/llama.cpp" ]; then
  mkdir -p "$work/src"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$work/src" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar xzf "$work/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work/src"
fi
llama_commit=unknown
if [ -e "$src/vendor/llama.cpp/.git" ]; then
  llama_commit=$(git -C "$src/vendor/llama.cpp" rev-parse --short HEAD 2>/dev/null || echo unknown)
fi

case "$peer" in
  llama-server)
    bdir="$work/llama.cpp-build"
    server="$bdir/bin/llama-server"
    if [ ! -x "$server" ]; then
      gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
      cmake -S "$src/vendor/llama.cpp" -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=ON
      cmake --build "$bdir" --target llama-server -j"$(nproc)"
    fi
    built=$("$server" --version 2>&1 | grep -m1 '^version' || true)
    version="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist, vendored llama.cpp $llama_commit, llama-server ($built)"
    ctx=$((slots * ctx_per_slot))
    cmd="$server -m {model} --host {host} --port {port} --no-webui -t $threads -tb $threads -np $slots -c $ctx"
    config="np$slots-t$threads"
    peer_args=()
    ;;
  llama-cpp-python)
    pvenv="$work/venv"
    if [ ! -x "$pvenv/bin/python" ] || ! "$pvenv/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
      python3 -m venv "$pvenv"
      CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_CURL=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$pvenv/bin/python" -m pip install -q "${src}[server]"
    fi
    version="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (vendored llama.cpp $llama_commit), llama_cpp.server"
    # One Llama context: n_ctx must hold the longest request; requests run one at a time.
    cmd="$pvenv/bin/python -m llama_cpp.server --model {model} --host {host} --port {port} --n_threads $threads --n_threads_batch $threads --n_ctx 8192 --interrupt_requests false --verbose false"
    config="serial-t$threads"
    # its server has no ignore_eos: min_tokens = max_tokens holds EOS back instead
    peer_args=(--min-tokens-eq-max)
    ;;
  *) echo "bench-serve-peer: --peer llama-server|llama-cpp-python" >&2; exit 2 ;;
esac

args=(--backend openai --server-cmd "$cmd" --model "$model" --peer-name "$peer"
      --peer-version "$version" --tag "$peer" --config "$config=" --results-dir "$results"
      --dataset "$results/dataset.json" "${mix_args[@]}" "${peer_args[@]}")
[ -z "$concurrency" ] || args+=(--concurrency "$concurrency")
[ -z "$rate" ] || args+=(--request-rate "$rate")

echo "bench-serve-peer: $(date -u +%FT%TZ) $version; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" "$root/bench/serve/sweep.py" "${args[@]}" "${extra[@]}"
"$py" "$root/bench/serve/plot.py" "$results"/*.json --out "$plot" \
  --title "$mix-prompt mix, $(nproc) CPUs: thetaserve vs $peer"
echo "bench-serve-peer: done -> $results"
