#!/usr/bin/env bash
# GPU tests and the step benchmark on a CUDA machine, in one command:
#   scripts/gpu-test.sh [--bin DIR] [--out DIR] [--no-bench] [--no-memcheck] [--bench-config DIR]
# --bin: a folder holding deepinfer, cuda_ops_tests, v4_golden_tests and step_bench (default: the newest
#   build folder with CUDA, searched for them); libraries they need may sit in DIR/lib or DIR/../lib.
# --out: where logs and results go (default: gpu-results/). The test data comes from tests/data.
# Runs: the CUDA op tests (each op against the CPU op), the V4 golden fixtures on the GPU (in the default GEMM
# mode and with DEEPINFER_CUDA_GEMM=tc, judged as the bf16 rows of the tolerance table, then with
# DEEPINFER_CUDA_GEMM=tiled at the fp32 bounds, and without programmatic dependent launch, DEEPINFER_CUDA_PDL=0),
# compute-sanitizer
# memcheck on the golden full forward and greedy run (and memcheck, racecheck and synccheck on the newer op
# tests), the golden fixtures in batch-invariant mode, the default model's perplexity on the GPU (also with FP8
# activations), the kernel
# micro-benchmarks found beside deepinfer, generation through the engine on the GPU, then
# bench/model_step: the card's bandwidth and matrix rate and transformers eager (hf_step_bench.py, when
# torch and transformers are installed), and step_bench on the same config with --load-format random (prefill
# again with FP8 activations).
set -uo pipefail
cd "$(dirname "$0")/.."

bin="" out="gpu-results" bench=1 memcheck=1 bench_config="bench/configs/deepseek-v4-flash-4l"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --no-bench) bench=0; shift ;;
        --no-memcheck) memcheck=0; shift ;;
        --bench-config) bench_config="$2"; shift 2 ;;
        *) echo "gpu-test.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"

find_bin() {  # name -> path
    if [ -n "$bin" ]; then
        [ -x "$bin/$1" ] && echo "$bin/$1"
        return
    fi
    for dir in build-cuda build; do
        [ -d "$dir" ] && find "$dir" -name "$1" -type f -perm -u+x 2>/dev/null | head -1 && return
    done
}
for name in deepinfer cuda_ops_tests v4_golden_tests step_bench; do
    path="$(find_bin "$name")"
    [ -n "$path" ] || { echo "gpu-test.sh: $name not found (build with -DDI_CUDA=ON, or pass --bin)" >&2; exit 2; }
    declare "bin_${name}=$path"
done
for lib in "$(dirname "$bin_deepinfer")/lib" "$(dirname "$bin_deepinfer")/../lib"; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export DEEPINFER_TEST_DATA_DIR="$PWD/tests/data"

failed=()
step() {  # name, command...: runs it with its output in $out/<name>.log and a one-line verdict
    local name="$1"; shift
    local t0=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        echo "PASS  $name ($((SECONDS - t0)) s)"
    else
        echo "FAIL  $name ($((SECONDS - t0)) s): see $out/$name.log"
        tail -n 15 "$out/$name.log" | sed 's/^/      /'
        failed+=("$name")
    fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step cuda_ops "$bin_cuda_ops_tests"
step golden_cuda env DEEPINFER_TEST_DEVICE=cuda "$bin_v4_golden_tests"
step golden_cuda_tc env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_GEMM=tc "$bin_v4_golden_tests"
step golden_cuda_tiled env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_GEMM=tiled "$bin_v4_golden_tests"
step golden_cuda_nopdl env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_PDL=0 "$bin_v4_golden_tests"
grep -h "tests ran\|PASSED\|FAILED" "$out/cuda_ops.log" "$out"/golden_cuda*.log | sed 's/^/      /'
if [ $memcheck = 1 ] && command -v compute-sanitizer >/dev/null; then
    step memcheck env DEEPINFER_TEST_DEVICE=cuda compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bin_v4_golden_tests" --gtest_filter='*FullForward*:*Greedy*'
    grep -h "ERROR SUMMARY" "$out/memcheck.log" | sed 's/^/      /'
    # The newer kernels (selection, attention, GEMMs and GEMVs, cuBLAS, MoE, mHC) under memcheck and synccheck;
    # racecheck (slow) on their smaller shapes.
    newer='*CudaSelect*:CudaArgmax*:CudaSampling*:*CudaAttention*:CudaIndexer*:CudaGemm*:CudaLinears*:CudaMoe*:'
    newer+='CudaOps.HyperConnections*:CudaFp8Gemm*:CudaMoeFp8*:CudaExpertsFp8.SmallWidth*:CudaExpertsFp8.RowsByAddress*'
    small='*CudaSelect*:CudaArgmax*:CudaSampling.RowsAreIndependentAndRepeatable:*CudaAttention.SparseAttentionDecodeShapes/*:CudaIndexer.ScoresShapes:'
    small+='CudaGemmTc.GroupedLinear:CudaGemmTc.GemvTensorCoresGrouped:CudaLinears*:CudaMoe.RouteMatchesCpu:'
    small+='CudaMoe*.ExpertLinearExtremeFp4Scales'
    for tool in memcheck racecheck synccheck; do
        filter="$newer"
        [ "$tool" = racecheck ] && filter="$small"
        step "ops_$tool" timeout 900 compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin_cuda_ops_tests" \
            --gtest_filter="$filter"
        grep -h "ERROR SUMMARY" "$out/ops_$tool.log" | sed 's/^/      /'
    done
fi
step golden_cuda_batch_invariant env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_BATCH_INVARIANT=1 "$bin_v4_golden_tests"
# The default model's held-out perplexity on the GPU (the CPU and the reference give 7.4934 / 7.4935).
# Bound: 0.5% (the tensor-core GEMM rounds activations to bf16; run 5 measured -0.01%).
json_number() {  # file, key -> the number after "key":
    sed -n "s/.*\"$2\": *\([-0-9.eE+]*\).*/\1/p" "$1" | head -1
}
step perplexity_cuda "$bin_deepinfer" perplexity --device cuda --json "$out/perplexity_cuda.json"
grep -h "^perplexity" "$out/perplexity_cuda.log" | sed 's/^/      /'
reference="$(json_number models/deepinfer-tiny-v4/reference.json perplexity_shipped_reference)"
step perplexity_vs_reference awk -v a="$(json_number "$out/perplexity_cuda.json" perplexity)" -v r="$reference" \
    'BEGIN { d = (a - r) / r; printf "GPU %s vs reference %s: %+.3f%% (bound 0.5%%)\n", a, r, 100 * d;
             exit !(a != "" && d < 0.005 && d > -0.005) }'
sed 's/^/      /' "$out/perplexity_vs_reference.log"
# With FP8 activations (DEEPINFER_FP8_ACTIVATIONS=1, as DeepSeek's reference inference quantizes them, the routed
# experts' inputs included; the CPU gives 7.5004): the same bound.
step perplexity_cuda_fp8 env DEEPINFER_FP8_ACTIVATIONS=1 "$bin_deepinfer" perplexity --device cuda \
    --json "$out/perplexity_cuda_fp8.json"
step perplexity_fp8_vs_reference awk -v a="$(json_number "$out/perplexity_cuda_fp8.json" perplexity)" -v r="$reference" \
    'BEGIN { d = (a - r) / r; printf "GPU, FP8 activations, %s vs reference %s: %+.3f%% (bound 0.5%%)\n", a, r, 100 * d;
             exit !(a != "" && d < 0.005 && d > -0.005) }'
sed 's/^/      /' "$out/perplexity_fp8_vs_reference.log"
# Kernel micro-benchmarks, when built (bench/gemv, bench/attention, bench/gemm; wgmma_chain_bench: the FP8 experts
# kernel's per-stage chain on the tensor cores).
# (gemm_bench without the fp32 tiled kernel: seconds a call at prefill sizes, and measured before.)
for micro in gemv_bench attention_bench "gemm_bench --no-tiled" wgmma_chain_bench; do
    path="$(dirname "$bin_deepinfer")/${micro%% *}"
    [ -x "$path" ] && step "${micro%% *}" "$path" ${micro#"${micro%% *}"}
done
# Generation through the engine (paged state, async scheduling) gives the same ids on both devices, greedy and
# sampled with a seed (sampling on the device: the host sampler's rules and Philox draws), on the fp32 GEMM
# (bf16 tensor cores need not keep every id).
generate() {  # device, name, sampling options...
    local device="$1" name="$2"; shift 2
    "$bin_deepinfer" generate --model tests/data/v4/v4_tiny_c --ids-npy tests/data/v4/v4_tiny_c/ids.npy \
        --max-tokens 48 --ignore-eos --quiet --device "$device" --out "$out/${name}_$device.npy" "$@"
}
sampled=(--temperature 0.8 --top-p 0.9 --top-k 50 --seed 7)
step generate_cuda bash -c "$(declare -f generate); out=$out bin_deepinfer=$bin_deepinfer; \
    generate cpu greedy --temperature 0 && DEEPINFER_CUDA_GEMM=tiled generate cuda greedy --temperature 0 && \
    cmp $out/greedy_cpu.npy $out/greedy_cuda.npy && generate cpu sampled ${sampled[*]} && \
    DEEPINFER_CUDA_GEMM=tiled generate cuda sampled ${sampled[*]} && cmp $out/sampled_cpu.npy $out/sampled_cuda.npy"

if [ $bench = 1 ]; then
    bw=4300 tf=790
    if python3 -c "import torch, transformers" 2>/dev/null; then
        step hf_reference python3 bench/model_step/hf_step_bench.py "$bench_config" --out "$out/hf_step_bench.json"
        read -r bw tf < <(python3 -c "import json; r = json.load(open('$out/hf_step_bench.json')); \
print(r['bandwidth_gbs'], r['matmul_tflops'])" 2>/dev/null || echo "$bw $tf")
    else
        echo "SKIP  hf_reference (no torch/transformers; floors use ${bw} GB/s and ${tf} TFLOP/s)"
    fi
    step step_bench "$bin_step_bench" "$bench_config" --device cuda --load-format random \
        --bandwidth-gbs "$bw" --matmul-tflops "$tf" --json "$out/step_bench.json"
    sed -n '/^batch\|^prefill\|^[0-9]/p' "$out/step_bench.log" | sed 's/^/      /'
    # Prefill with FP8 activations (the FP8 weights' products on cuBLASLt's FP8 GEMM).
    step step_bench_fp8 env DEEPINFER_FP8_ACTIVATIONS=1 "$bin_step_bench" "$bench_config" --device cuda \
        --load-format random --decode-batches '' --bandwidth-gbs "$bw" --matmul-tflops "$tf" \
        --json "$out/step_bench_fp8.json"
    sed -n '/^prefill\|^[0-9]/p' "$out/step_bench_fp8.log" | sed 's/^/      /'
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu-test.sh: ${#failed[@]} step(s) failed: ${failed[*]}"
    exit 1
fi
echo "gpu-test.sh: all steps passed; logs in $out/"
