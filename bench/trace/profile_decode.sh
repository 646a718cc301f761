#!/usr/bin/env bash
# The decode step's standard measurements on a CUDA machine, in one command (what a change to a decode kernel needs
# before it is merged, and where the step's time goes after it):
#   bench/trace/profile_decode.sh --bin DIR [--old DIR] [--out DIR] [--config DIR] [--batches 1,8,32]
#                                 [--pairs N] [--ncu REGEX] [--ncu-skip N] [--trace-lib FILE]
# --bin: a folder holding step_bench (libraries it needs may sit in DIR/lib or DIR/../lib);
# --old: another build's folder with its own step_bench, run interleaved with --bin's (an A/B of the same run);
# --out: where the results go (default: profile-results/);
# --config: the model config (default: the 8-layer V4-Flash-width model with every MoE layer hash-routed);
# --pairs: interleaved step_bench runs of each build (default 2);
# --ncu REGEX: also profile one launch of a kernel whose demangled name matches REGEX, at the largest batch, with its
#   stall reasons (ncu writes template arguments as "(int)4": 'sparse_attention_tc_kernel<\(int\)4, \(int\)8,
#   \(bool\)0>'). step_bench prefills the shared context before the decode steps, so a kernel that the prefill also
#   runs needs --ncu-skip N (the matching launches to pass over) or a decode-only instantiation in REGEX;
# --trace-lib: the CUPTI tracer (default: lib/libdi_cupti_trace.so next to --bin).
# Writes: step_new*.txt / step_old*.txt (step_bench's tables), timeline_b<batch>.txt (decode_timeline.py --by-launch
# on a CUPTI trace of each batch), ncu.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."

bin="" old="" out="profile-results" config="bench/configs/deepseek-v4-flash-8l-uniform-routing" batches="1,8,32"
pairs=2 ncu_regex="" ncu_skip=0 trace_lib=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --old) old="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --config) config="$2"; shift 2 ;;
        --batches) batches="$2"; shift 2 ;;
        --pairs) pairs="$2"; shift 2 ;;
        --ncu) ncu_regex="$2"; shift 2 ;;
        --ncu-skip) ncu_skip="$2"; shift 2 ;;
        --trace-lib) trace_lib="$2"; shift 2 ;;
        *) echo "profile_decode.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bin/step_bench" ] || { echo "profile_decode.sh: no step_bench in '$bin' (--bin DIR)" >&2; exit 2; }
[ -z "$old" ] || [ -x "$old/step_bench" ] || { echo "profile_decode.sh: no step_bench in '$old'" >&2; exit 2; }
for lib in "$bin/lib" "$bin/../lib"; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -z "$trace_lib" ] && [ -f "$lib/libdi_cupti_trace.so" ] && trace_lib="$(cd "$lib" && pwd)/libdi_cupti_trace.so"
done
mkdir -p "$out"

args=("$config" --device cuda --load-format random --prefill "" --bandwidth-gbs 4260 --matmul-tflops 789)
rows() { grep -E '^(batch|[0-9])' | cut -c1-75; }  # step_bench's table

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for i in $(seq 1 "$pairs"); do
    echo "== new $i"
    "$bin/step_bench" "${args[@]}" --decode-batches "$batches" 2>&1 | tee "$out/step_new$i.txt" | rows
    if [ -n "$old" ]; then
        echo "== old $i"
        "$old/step_bench" "${args[@]}" --decode-batches "$batches" 2>&1 | tee "$out/step_old$i.txt" | rows
    fi
done

if [ -n "$trace_lib" ]; then
    for b in ${batches//,/ }; do
        # Without the runtime-call records: at batch 1 they slow the host enough to starve the GPU.
        CUDA_INJECTION64_PATH="$trace_lib" DEEPINFER_TRACE_FILE="$out/trace_b$b.csv" DEEPINFER_TRACE_API=0 \
            "$bin/step_bench" "${args[@]}" --decode-batches "$b" > /dev/null 2>&1
        python3 bench/trace/decode_timeline.py "$out/trace_b$b.csv" --top 45 --by-launch > "$out/timeline_b$b.txt"
        rm -f "$out/trace_b$b.csv"
        echo "== timeline, batch $b"
        sed -n '/^median step/,+12p' "$out/timeline_b$b.txt"
    done
else
    echo "profile_decode.sh: no CUPTI tracer found (--trace-lib); no timelines"
fi

if [ -n "$ncu_regex" ]; then
    largest="${batches##*,}"
    timeout 300 ncu --kernel-name-base demangled --kernel-name "regex:$ncu_regex" --launch-skip "$ncu_skip" \
        --launch-count 1 --set full \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        "$bin/step_bench" "${args[@]}" --decode-batches "$largest" --decode-steps 1 --repeats 1 > "$out/ncu.txt" 2>&1
    echo "== ncu ($ncu_regex, batch $largest)"
    grep -E "^  [^ ].*\(|Duration|Registers Per|Grid Size|Issued Warp Per|stalled_.*ratio" "$out/ncu.txt" | head -30
fi
echo "profile_decode.sh: results in $out/"
