#!/usr/bin/env bash
# Stages the GPU check for the device tool, whose every call carries at most 64 MiB: the
# checkout's tracked and untracked files plus what `carry` names. The packed binaries
# (scripts/gpu-pack.sh, ~90 MB) and SmolLM2 (~98 MB) do not fit in one call, so they travel as
# xz bundles cut into parts, one folder .xfer/N per call, each sized to what the checkout leaves
# of the limit (a part goes to the first call with room). Call 1 brings the binaries (and the θ
# file) and runs the check without the model, which holds the kernel figures the acceptance
# names, and Nsight Compute on Top-θ's kernels; the call that completes the model runs the
# model's tests and decode benchmark. Two calls (2026-12-05): the pack compresses to 12.5 MB
# and shares call 1 with the model's second part. A warm machine keeps ignored paths between
# calls, and every call also copies its parts to /tmp there, so --unpack finds the earlier
# ones either way.
#
#   scripts/gpu-stage.sh [--pack DIR] [--model FILE] [--theta FILE[,FILE]] [--deadline S]
#                                                        # here: writes .xfer/, prints the calls
#   scripts/gpu-stage.sh --unpack [--need BUNDLE...]                   # there, first in every call
#
# --deadline (default 540, for 600 s calls): the checks' --deadline in the printed calls; where
# the device has less time left than a full call, the call's limit less 60 s.
# --need names bundles (as the printed calls do) that must be unpacked by the end of this call:
# if one is not (a part missing, the machine gone cold between calls), it fails, so the check
# after it does not run without its files.
#
# Without --theta the end-to-end decode rows are dense only; a θ file takes a minute here:
#   build/thetaserve calibrate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --corpus data/kjv.txt \
#     --k 64 --placement post --context 2048 --max-tokens 8192 --out out/fidelity/theta_k64_post.json
# and a pre-softmax one (one pass on the GPU) the same way with --k 128 --placement pre
# (out/fidelity/theta_k128_pre.json); --theta A,B runs the rows with each.
# --pack takes binaries already packed (e.g. in a build tree beside this checkout, which must
# hold the same source); without it gpu-pack.sh builds here. The device tool sends the checkout
# the session started in, so run this there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
store=/tmp/thetaserve-xfer

say() { echo "[gpu-stage] $*"; }
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

# Puts the parts this call carried beside the earlier ones and unpacks every bundle whose parts
# are all there. A bundle's name holds the start of its sha256 (NAME.SHA.part-I-of-N), so the
# parts of an earlier stage left on the machine never join a later one's.
unpack() {
  mkdir -p "$store"
  find .xfer -type f \( -name '*.part-*' -o -name '*.sha256' \) -exec cp -f {} "$store/" \; 2>/dev/null || true
  local sums bundle count have f sum
  for sums in "$store"/*.sha256; do
    [ -e "$sums" ] || { say "no parts in .xfer/ or $store"; return 1; }
    bundle=$(basename "$sums" .sha256)
    sum=$(awk '{print $1}' "$sums") count=$(awk '{print $2}' "$sums")
    [ -e "$store/$bundle.unpacked" ] && { say "$bundle: unpacked by an earlier call"; continue; }
    have=$(find "$store" -maxdepth 1 -name "$bundle.part-*-of-$count" | wc -l)
    if [ "$have" -lt "$count" ]; then
      say "$bundle: $have of $count parts here; the next call brings more"
      continue
    fi
    for i in $(seq 1 "$count"); do cat "$store/$bundle.part-$i-of-$count"; done >"$store/$bundle"
    if [ "$(sha256sum <"$store/$bundle" | cut -d' ' -f1)" != "$sum" ]; then
      say "$bundle: its parts join to the wrong bytes (sha256 differs)"
      return 1
    fi
    if command -v xz >/dev/null 2>&1; then
      tar -xJf "$store/$bundle" -C "$root"
    else
      python3 -m tarfile -e "$store/$bundle" "$root"  # Python's lzma, where xz is missing
    fi
    rm -f "$store/$bundle"
    touch "$store/$bundle.unpacked"
    say "$bundle: unpacked ($count parts, sha256 ok)"
  done
  for f in .devbin/bin models/SmolLM2-135M-Instruct.Q4_1.gguf .devbin/theta.json; do
    [ -e "$f" ] && say "present: $f"
  done
  return 0
}

if [ "${1:-}" = "--unpack" ]; then
  shift
  unpack
  [ "${1:-}" = "--need" ] && shift
  for need in "$@"; do
    [ -e "$store/$need.unpacked" ] || { say "$need is not all here: not running the check"; exit 3; }
  done
  exit 0
fi

pack="" model="models/SmolLM2-135M-Instruct.Q4_1.gguf" theta="" deadline=540
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --theta) theta=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
if [ -z "$pack" ]; then
  bash scripts/gpu-pack.sh .devbin
  pack=.devbin
fi
[ -d "$pack/bin" ] || { echo "no binaries in $pack/bin (scripts/gpu-pack.sh makes them)" >&2; exit 1; }
[ -f "$model" ] || { echo "no model at $model (scripts/fetch-model.sh)" >&2; exit 1; }
# --theta takes one file or several, comma-separated (e.g. a post-softmax and a pre-softmax
# table: the end-to-end rows then run each).
IFS=, read -r -a thetas <<<"$theta"
for f in "${thetas[@]}"; do
  [ -f "$f" ] || { echo "no θ file at $f" >&2; exit 1; }
done

# What every call carries anyway: tracked files and untracked ones git does not ignore.
always=$( { git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -L -c %s 2>/dev/null || true; } |
  awk '{ s += $1 } END { print s + 0 }')
limit=$((64 * 1024 * 1024))
margin=$((2 * 1024 * 1024))
budget=$((limit - always - margin))
say "the checkout travels with every call: $(mb "$always"); a call's limit $(mb "$limit"); parts up to $(mb "$budget")"
[ "$budget" -gt $((8 * 1024 * 1024)) ] || { echo "the checkout leaves too little of the limit" >&2; exit 1; }

rm -rf .xfer
mkdir -p .xfer/stage/.devbin .xfer/stage/models
cp -a "$pack"/bin "$pack"/lib .xfer/stage/.devbin/
staged_thetas=""
for i in "${!thetas[@]}"; do
  name=theta.json
  [ "$i" -gt 0 ] && name=theta-$i.json
  cp "${thetas[$i]}" ".xfer/stage/.devbin/$name"
  staged_thetas="$staged_thetas${staged_thetas:+,}.devbin/$name"
done
ln -s "$(realpath "$model")" .xfer/stage/models/SmolLM2-135M-Instruct.Q4_1.gguf

# bundle NAME PATH...: an xz tarball of PATHs (relative to the stage) cut into parts of the budget.
declare -a parts=()
bundle() {
  local name=$1; shift
  say "compressing $name ($*)"
  # One stream with a dictionary larger than the pack: each of its seven binaries carries the
  # same ~12 MB of kernels (the fatbin), which a smaller window (xz -6: 8 MiB, and -T0's blocks)
  # cannot see repeat: 90 MB became 77 MB that way, 12.5 MB this way (two device calls fewer).
  tar -chf - -C .xfer/stage "$@" | xz -T1 --lzma2=preset=6,dict=192MiB >".xfer/$name"
  local size count sum id i
  size=$(stat -c %s ".xfer/$name")
  count=$(( (size + budget - 1) / budget ))
  sum=$(sha256sum <".xfer/$name" | cut -d' ' -f1)
  id="$name.${sum:0:12}"
  split -b "$budget" -d -a 2 ".xfer/$name" ".xfer/$id.cut-"
  for i in $(seq 1 "$count"); do
    mv ".xfer/$id.cut-$(printf %02d $((i - 1)))" ".xfer/$id.part-$i-of-$count"
    parts+=("$id.part-$i-of-$count")
  done
  echo "$sum  $count" >".xfer/$id.sha256"
  rm ".xfer/$name"
  say "$name: $(mb "$size") in $count part(s)"
}
bundle devbin.tar.xz .devbin
bundle model.tar.xz models
rm -rf .xfer/stage

# One folder per call; each part, in order, goes to the first call with room for it (the
# binaries first, so the kernel check runs in call 1; a small pack and the model's last part
# then share it: two calls instead of three). done_at[bundle]: the call that brings the
# bundle's last part.
declare -A done_at=()
declare -a used=()
call=0
for p in "${parts[@]}"; do
  size=$(stat -c %s ".xfer/$p")
  at=0
  for i in $(seq 1 "$call"); do
    if [ $((used[i] + size)) -le "$budget" ]; then at=$i; break; fi
  done
  if [ "$at" = 0 ]; then call=$((call + 1)) at=$call used[call]=0; mkdir -p ".xfer/$call"; fi
  mv ".xfer/$p" ".xfer/$at/"
  cp ".xfer/${p%%.part-*}.sha256" ".xfer/$at/"
  b=${p%%.part-*}
  [ "${done_at[$b]:-0}" -lt "$at" ] && done_at[$b]=$at
  used[at]=$((used[at] + size))
done
rm -f .xfer/*.sha256
devbin_id=$(basename -s .sha256 .xfer/*/devbin.tar.xz.*.sha256 | head -1)
model_id=$(basename -s .sha256 .xfer/*/model.tar.xz.*.sha256 | head -1)

theta_flag=""
[ -n "$staged_thetas" ] && theta_flag=" --theta $staged_thetas"
echo
echo "== device calls, in order and back to back (a machine idle for 30 s goes back), each with"
echo "   timeout_s 600: the check keeps to --deadline $deadline (unpacking and the copy back take the rest)"
echo "   and prints its summary last =="
# The check without the model runs where the binaries are complete (the kernel tables, first);
# the model's tests where the model is, or the whole check at once if both arrive together.
for i in $(seq 1 "$call"); do
  size=$(du -cb ".xfer/$i" | tail -1 | cut -f1)
  cmd="bash scripts/gpu-stage.sh --unpack"
  if [ "$i" = "${done_at[$devbin_id]}" ] && [ "$i" = "${done_at[$model_id]}" ]; then
    cmd="$cmd --need $devbin_id $model_id && bash scripts/gpu-check.sh --prebuilt .devbin --deadline $deadline --ncu$theta_flag"
  elif [ "$i" = "${done_at[$devbin_id]}" ]; then
    cmd="$cmd --need $devbin_id && bash scripts/gpu-check.sh --prebuilt .devbin --deadline $deadline --ncu$theta_flag"
  elif [ "$i" = "${done_at[$model_id]}" ]; then
    cmd="$cmd --need $devbin_id $model_id && bash scripts/gpu-check.sh --prebuilt .devbin --deadline $deadline --only-model$theta_flag"
  fi
  echo "call $i: carry [\".xfer/$i\"] ($(mb $((size + always))) in all)"
  echo "  $cmd"
done
