#!/usr/bin/env bash
# An A/B of two builds' step times on a CUDA machine, in one command (what a change to the model's GPU path needs
# before it is merged): step_bench of both builds interleaved (old new new old, repeated), so that drift of the
# machine falls on both alike, then the new build's per-op prefill profile.
#   bench/model_step/ab_step.sh --bin DIR --old DIR [--out DIR] [--config DIR] [--prefill 8x2048]
#                               [--batches 1,8,32] [--rounds N] [--no-profile] [--fp8]
# --bin / --old: folders holding step_bench (the new and the base build; libraries they need may sit in DIR/lib or
#   DIR/../lib);
# --out: where the results go (default: ab-results/): step_<i>_<new|old>.json, steps.txt (the tables), profile.txt
#   (few files: the device tool brings back a limited number; step_bench's full logs go to a temporary folder);
# --config: the model config (default: the 8-layer V4-Flash-width model with every MoE layer hash-routed);
# --prefill / --batches: step_bench's shapes ('' for none);
# --rounds: repetitions of the old-new-new-old order (default 1);
# --fp8: one more prefill of the new build with DEEPINFER_FP8_ACTIVATIONS=1.
# Prints each run's tables and the prefill means of both builds.
set -uo pipefail
cd "$(dirname "$0")/../.."

bin="" old="" out="ab-results" config="bench/configs/deepseek-v4-flash-8l-uniform-routing" prefill="8x2048"
batches="1,8,32" rounds=1 profile=1 fp8=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --old) old="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --config) config="$2"; shift 2 ;;
        --prefill) prefill="$2"; shift 2 ;;
        --batches) batches="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --no-profile) profile=0; shift ;;
        --fp8) fp8=1; shift ;;
        *) echo "ab_step.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for dir in "$bin" "$old"; do
    [ -x "$dir/step_bench" ] || { echo "ab_step.sh: no step_bench in '$dir' (--bin DIR --old DIR)" >&2; exit 2; }
    for lib in "$dir/lib" "$dir/../lib"; do
        [ -d "$lib" ] && export LD_LIBRARY_PATH="$(cd "$lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
done
mkdir -p "$out"
: > "$out/steps.txt"
logs="$(mktemp -d)"

args=("$config" --device cuda --load-format random --bandwidth-gbs 4260 --matmul-tflops 789 --repeats 4
      --prefill "$prefill" --decode-batches "$batches")
tables() { grep -E '^(batch|prefill|[0-9])' | cut -c1-100; }  # step_bench's tables
prefill_ms() { grep -A1 '^prefill ' "$1" | awk 'NR == 2 { print $2 }'; }

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
i=0
new_ms=() old_ms=()
for r in $(seq 1 "$rounds"); do
    for which in old new new old; do
        i=$((i + 1))
        dir="$old"
        [ "$which" = new ] && dir="$bin"
        log="$logs/step_${i}_$which.txt"
        "$dir/step_bench" "${args[@]}" --json "$out/step_${i}_$which.json" > "$log" 2>&1
        { echo "== $i $which"; tables < "$log"; } | tee -a "$out/steps.txt"
        ms="$(prefill_ms "$log")"
        if [ -n "$ms" ]; then
            if [ "$which" = new ]; then new_ms+=("$ms"); else old_ms+=("$ms"); fi
        fi
    done
done
mean() { printf '%s\n' "$@" | awk '{ s += $1; n++ } END { if (n) printf "%.2f (%d runs)", s / n, n }'; }
if [ ${#new_ms[@]} -gt 0 ]; then
    echo "prefill $prefill: new $(mean "${new_ms[@]}") ms, old $(mean "${old_ms[@]}") ms" | tee -a "$out/steps.txt"
fi

if [ "$profile" = 1 ] && [ -n "$prefill" ]; then
    DEEPINFER_CUDA_PROFILE=1 "$bin/step_bench" "${args[@]}" --decode-batches "" --repeats 2 \
        > "$out/profile.txt" 2>&1
    echo "== the new build's per-op prefill profile (2 timed steps)"
    sed -n '/^ *op  /,/^ *total/p' "$out/profile.txt"
fi
if [ "$fp8" = 1 ] && [ -n "$prefill" ]; then
    DEEPINFER_FP8_ACTIVATIONS=1 "$bin/step_bench" "${args[@]}" --decode-batches "" --json "$out/step_fp8_new.json" \
        > "$logs/step_fp8_new.txt" 2>&1
    { echo "== new, FP8 activations"; tables < "$logs/step_fp8_new.txt"; } | tee -a "$out/steps.txt"
fi
echo "ab_step.sh: results in $out/, step_bench's logs in $logs/"
