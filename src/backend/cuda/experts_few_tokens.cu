// The routed experts of a few tokens (decode at batches 1-4) on mma.sync: each slot (a token times one of its top-k
// experts) is its own work item, since so few tokens' slots rarely share an expert (uniform routing: 6 / 11.5 / 23.4
// distinct experts for 6 / 12 / 24 slots). Two launches: gate/up with SwiGLU in its epilogue, writing h in bf16, then
// down, writing each slot's output row in f32.
//
// Why not the fp32 expert_linear or the wgmma kernels (experts_wgmma.cu) here: the fp32 kernel spends ~6 instructions a
// weight (the FP4 decode to f32 and an FMA each) and so is bound by issue at ~1.8 TB/s; the wgmma kernels, built for
// tiles of several tokens, have one CTA per 128-feature tile of each touched expert (96 at one token) and a per-stage
// consumer chain to stream through. Here a lane decodes its FP4 word once into bf16 pairs (fp4_subnormal.cuh: ~2
// instructions a weight, the E8M0 scale folded into the pair multiply) and one m16n8k16 mma takes 16 weights of each
// of its two rows. H200, D 4096, I 2048, top-6 of 256 experts (gemv_bench --experts-only): the routed FFN at 1 / 2 / 4
// / 8 tokens 37.7 / 65.0 / 118.6 / 226.0 us against 46.8 (fp32 expert_linear) / 93.4 / 131.2 / 236.4 (wgmma); at 8
// tokens the two are within a few percent. In the 8-layer decode step they gain less than alone (their blocks fill
// every SM, so the shared expert on the side queue waits for them where it ran beside the wgmma kernels' one CTA an
// SM) and lose at 4 tokens, so the backend takes them up to kRoutedFewTokensAuto (2) tokens by default and up to
// kRoutedFewTokensMax (4) with DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=1 (see CudaBackend::few_token_experts).
//
// Layout of an mma: A = 16 weight rows x 16 k (gate/up: rows 0-7 the W1 rows of 8 features, rows 8-15 their W3 rows,
// so that a lane's two accumulator rows are one feature's gate and up; down: 16 W2 rows), B = the slot's activations
// in column 0 (lanes with g = lane / 4 > 0 supply zeros for columns 1-7). The mma's 16 logical k of a lane c = lane % 4
// are physical k of its own 16-byte chunk c of the row's 128-k block (32 codes: 4 words, two k16 steps a word), in the
// pair order the decode yields: word codes (0, 2), (1, 3) for the step's first half, (4, 6), (5, 7) for the second.
// So the activations are staged in shared memory as bf16 with each group of 8 stored in the order 0 2 1 3 4 6 5 7
// (perm8), and lane c reads the 8 of word w of its chunk with one 16-byte load.
//
// Work item: one slot's 16-row A tile (8 features for gate/up, 16 for down). Block: up to 8 warps along K (k_split:
// warp w takes 128-k blocks NKB w .. NKB w + NKB - 1); the warps' column-0 sums meet in shared memory and are added in
// warp order (deterministic, independent of the other slots and of which block takes the item). Blocks are
// persistent, two an SM (three for down at K 2048: blocks_per_sm), each walking a run of items with the next item's
// weights in flight while it multiplies the current one (few_tokens_kernel). Numerics as the wgmma kernels': x and h
// rounded to bf16, weights exact, fp32 accumulation, SwiGLU in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/fp4_subnormal.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma_common.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxWarps = 8;
constexpr int kBlockK = 128;  // k of a lane group's four 16-byte chunks (one per lane c)

// A product's K over the block's warps: K / 128 warps of one 128-k block each up to K = 1024, else 8 warps of
// K / 1024 blocks (2 or 4). Other K do not apply. (Also measured: up to 16 warps of at most 2 blocks, 512 threads, two
// blocks an SM instead of three: slower, 45.7 against 37.7 us for one token's routed FFN at the model width, 154.6
// against 118.6 at four tokens.)
struct KSplit {
    int warps, nkb;
};
inline KSplit k_split(int64_t k) {
    if (k <= 0 || k % kBlockK != 0) return {0, 0};
    if (k <= kMaxWarps * kBlockK) return {static_cast<int>(k / kBlockK), 1};
    const int64_t nkb = k / (kMaxWarps * kBlockK);
    return k % (kMaxWarps * kBlockK) == 0 && (nkb == 2 || nkb == 4) ? KSplit{kMaxWarps, static_cast<int>(nkb)}
                                                                    : KSplit{0, 0};
}

struct FewTokensParams {
    const ExpertPtrs* experts;
    int num_experts;
    const int32_t* expert_of_row;  // [slots]
    int rows_per_input;            // gate/up: slot s reads x row s / rows_per_input
    const float* x;                // gate/up: [tokens, k] f32
    const uint16_t* h_in;          // down: [slots, k] bf16 bits, perm8 order
    uint16_t* h_out;               // gate/up: [slots, n] bf16 bits, perm8 order
    float* out;                    // down: [slots, n] f32
    int k, n;
    float limit;  // SwiGLU clamp (0: none)
};

// perm8: stored position i of a group of 8 holds element perm8(i) (an involution: also element -> position).
__device__ __forceinline__ int perm8(int i) { return (i == 1 || i == 2) ? 3 - i : (i == 5 || i == 6) ? 11 - i : i; }

// A warp's K range [k0, k0 + 128 NKB) of the slot's activation row into shared memory as bf16 in perm8 order (gate/up:
// rounded from the f32 row): each warp reads only the activations its own products take, so no block barrier stands
// between a warp's weight loads and its products.
template <bool kGateUp, int NKB>
__device__ __forceinline__ void stage_activations(const FewTokensParams& p, int slot, uint16_t* xs, int k0, int lane) {
    constexpr int kGroups = NKB * kBlockK / 8;  // groups of 8 in the warp's range
#pragma unroll
    for (int i = lane; i < kGroups; i += 32) {
        const int q = k0 / 8 + i;
        if constexpr (kGateUp) {
            const float4* row =
                reinterpret_cast<const float4*>(p.x + static_cast<int64_t>(slot / p.rows_per_input) * p.k);
            const float4 a = row[2 * q], b = row[2 * q + 1];
            uint4 v;
            v.x = mma::pack_bf16(a.x, a.z);
            v.y = mma::pack_bf16(a.y, a.w);
            v.z = mma::pack_bf16(b.x, b.z);
            v.w = mma::pack_bf16(b.y, b.w);
            reinterpret_cast<uint4*>(xs)[q] = v;
        } else {
            reinterpret_cast<uint4*>(xs)[q] =
                reinterpret_cast<const uint4*>(p.h_in + static_cast<int64_t>(slot) * p.k)[q];
        }
    }
}

// A warp's NKB blocks of its two rows (wa, ea: A row g; wb, eb: A row g + 8) against the staged activations.
template <int NKB, bool kSlow>
__device__ __forceinline__ void warp_products(float (&acc)[4], const uint4 (&wa)[NKB], const uint4 (&wb)[NKB],
                                              const uint32_t (&ea)[NKB], const uint32_t (&eb)[NKB], const uint16_t* xs,
                                              int k0, int g, int c) {
#pragma unroll
    for (int kb = 0; kb < NKB; ++kb) {
        // The slow path's post multipliers (subnormal_scale), once a block rather than once a word.
        const SubnormalScale sa = subnormal_scale(ea[kb]), sb = subnormal_scale(eb[kb]);
        const uint32_t alpha_a = kSlow ? sa.alpha : subnormal_alpha(ea[kb]);
        const uint32_t alpha_b = kSlow ? sb.alpha : subnormal_alpha(eb[kb]);
        const uint4* xq = reinterpret_cast<const uint4*>(xs + k0 + kb * kBlockK + 32 * c);  // word w: xq[w]
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            uint32_t a[4], b[4];
            fp4_word_to_a(wgmma::word_of(wa[kb], w), alpha_a, a);
            fp4_word_to_a(wgmma::word_of(wb[kb], w), alpha_b, b);
            if constexpr (kSlow) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    a[j] = chunks::mul_bf16x2(a[j], sa.post), b[j] = chunks::mul_bf16x2(b[j], sb.post);
            }
            const uint4 x = g == 0 ? xq[w] : make_uint4(0, 0, 0, 0);  // column 0 only
            mma::mma_bf16(acc, a[0], b[0], a[1], b[1], x.x, x.y);     // codes (0, 2) | (1, 3)
            mma::mma_bf16(acc, a[2], b[2], a[3], b[3], x.z, x.w);     // codes (4, 6) | (5, 7)
        }
    }
}

// A warp's loads for one work item (slot, tile of features): its two rows' 16-byte chunks and scale bytes of its K
// range, issued at once; bad: the slot's expert id is outside [0, E) (nothing loaded).
template <int NKB>
struct ItemLoads {
    uint4 wa[NKB], wb[NKB];
    uint32_t ea[NKB], eb[NKB];
    int slot, f0;
    bool bad;
};
template <bool kGateUp, int NKB>
__device__ __forceinline__ void load_item(ItemLoads<NKB>& l, const FewTokensParams& p, int item, int k0, int g, int c) {
    constexpr int kTile = kGateUp ? 8 : 16;  // features an item
    const int tiles = p.n / kTile;
    l.slot = item / tiles, l.f0 = item % tiles * kTile;
    const int e = p.expert_of_row[l.slot];
    l.bad = e < 0 || e >= p.num_experts;
    if (l.bad) return;
    const ExpertPtrs& ex = p.experts[e];
    const int which_a = kGateUp ? 0 : 2, which_b = kGateUp ? 1 : 2;
    const int64_t row_a = l.f0 + g, row_b = kGateUp ? l.f0 + g : l.f0 + g + 8;
    const uint4* da = reinterpret_cast<const uint4*>(ex.data[which_a] + row_a * (p.k / 2) + k0 / 2) + c;
    const uint4* db = reinterpret_cast<const uint4*>(ex.data[which_b] + row_b * (p.k / 2) + k0 / 2) + c;
    const uint8_t* sa = ex.scale[which_a] + row_a * (p.k / 32) + k0 / 32 + c;
    const uint8_t* sb = ex.scale[which_b] + row_b * (p.k / 32) + k0 / 32 + c;
#pragma unroll
    for (int kb = 0; kb < NKB; ++kb) {
        l.wa[kb] = __ldg(da + kb * (kBlockK / 32)), l.wb[kb] = __ldg(db + kb * (kBlockK / 32));
        l.ea[kb] = __ldg(sa + kb * (kBlockK / 32)), l.eb[kb] = __ldg(sb + kb * (kBlockK / 32));
    }
}

// Blocks an SM the registers allow: 2, or 3 for the down product at NKB <= 2 (72 registers, no spills;
// gate/up takes 123 and NKB 4 spills at 80). The kernel's launch bounds and the persistent grid's default.
constexpr int blocks_per_sm(bool gate_up, int nkb) { return !gate_up && nkb <= 2 ? 3 : 2; }

// Block: items [blockIdx.x per, + per) in order (item = slot x tiles + tile, so a block's items share their slot's
// activations and walk adjacent weight rows), each warp loading the next item's weights before it multiplies the
// current one's. per = 1 (a block an item, DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT=0) or enough for the persistent grid
// (few_tokens_grid).
template <bool kGateUp, int NKB>
__global__ void __launch_bounds__(32 * kMaxWarps, blocks_per_sm(kGateUp, NKB))
    few_tokens_kernel(const FewTokensParams p, int items, int per) {
    pdl_prologue();  // see pdl.cuh
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t* xs = reinterpret_cast<uint16_t*>(smem);       // [k] bf16, perm8
    float* red = reinterpret_cast<float*>(smem + 2 * p.k);  // [2][warps][16] the warps' column-0 sums, by item parity
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int warps = blockDim.x / 32, k0 = warp * NKB * kBlockK;
    constexpr int kTile = kGateUp ? 8 : 16;
    const int begin = blockIdx.x * per, end = min(begin + per, items);
    ItemLoads<NKB> cur, nxt;
    if (begin < end) load_item<kGateUp>(cur, p, begin, k0, g, c);
    int staged = -1;  // the slot whose activations this warp's range of xs holds
    for (int it = begin, parity = 0; it < end; ++it, parity ^= 1) {
        if (it + 1 < end) load_item<kGateUp>(nxt, p, it + 1, k0, g, c);
        float* rp = red + parity * warps * 16;
        if (!cur.bad) {
            if (cur.slot != staged) {
                stage_activations<kGateUp, NKB>(p, cur.slot, xs, k0, lane);
                __syncwarp();
                staged = cur.slot;
            }
            uint32_t any_e = 0;
#pragma unroll
            for (int kb = 0; kb < NKB; ++kb) any_e |= cur.ea[kb] | cur.eb[kb];
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            // Scales outside the fast range (never in a checkpoint) take the two-multiply path, the warp together.
            if (__any_sync(0xffffffffu, !subnormal_fast_scale(any_e)))
                warp_products<NKB, true>(acc, cur.wa, cur.wb, cur.ea, cur.eb, xs, k0, g, c);
            else
                warp_products<NKB, false>(acc, cur.wa, cur.wb, cur.ea, cur.eb, xs, k0, g, c);
            if (c == 0) rp[warp * 16 + g] = acc[0], rp[warp * 16 + g + 8] = acc[2];  // rows g, g + 8 of column 0
        }
        // One barrier an item: the sums of item it are read from rp while the warps go on to item it + 1 (the other
        // parity); they come back to this parity only after the next barrier, which the readers reach after reading.
        __syncthreads();
        if (threadIdx.x < kTile) {
            const int f = threadIdx.x;
            const int64_t at = static_cast<int64_t>(cur.slot) * p.n + cur.f0;
            if (cur.bad) {  // a NaN row (as expert_linear leaves it); h is not read for it
                if constexpr (!kGateUp) p.out[at + f] = __int_as_float(0x7fc00000);
            } else {
                float s0 = rp[f], s1 = kGateUp ? rp[f + 8] : 0.0f;
                for (int w = 1; w < warps; ++w) {
                    s0 += rp[w * 16 + f];
                    if constexpr (kGateUp) s1 += rp[w * 16 + f + 8];
                }
                if constexpr (kGateUp) {
                    const float hv = swiglu_value(s0 * kAccScale, s1 * kAccScale, p.limit);
                    p.h_out[at + perm8(f)] = __bfloat16_as_ushort(__float2bfloat16_rn(hv));
                } else {
                    p.out[at + f] = s0 * kAccScale;
                }
            }
        }
        cur = nxt;
    }
}

// DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT (read per call): 1 (default) persistent blocks walking their items
// with the next item's loads in flight; 0 a block an item.
bool few_tokens_persistent() {
    const char* v = std::getenv("DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT");
    const std::string mode = v && *v ? v : "1";
    DI_CHECK(mode == "0" || mode == "1", "DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT must be 0 or 1, not '", mode, "'");
    return mode == "1";
}

// The persistent grid of a product (both read per call): DEEPINFER_CUDA_FEW_TOKENS_GRID blocks for both products
// where set (fewer leave SMs to the kernels of the side queue, the shared expert, running beside them), else
// blocks_per_sm an SM, down's overridden by DEEPINFER_CUDA_FEW_TOKENS_DOWN_PER_SM (1-3). Three for down at K 2048
// instead of two (more loads in flight), H200 (gemv_bench --experts-only, the routed FFN, D 4096, I 2048): 36.9 / 63.5
// / 116 / 219 us at 1 / 2 / 4 / 8 tokens against 40.9 / 72.4 / 134.5 / 255.2.
int64_t few_tokens_grid(bool gate_up, int nkb) {
    const char* v = std::getenv("DEEPINFER_CUDA_FEW_TOKENS_GRID");
    const int64_t n = v && *v ? std::atoll(v) : 0;
    DI_CHECK(n >= 0 && n <= 65535, "DEEPINFER_CUDA_FEW_TOKENS_GRID must be 0-65535, not '", v ? v : "", "'");
    if (n > 0) return n;
    int64_t per_sm = blocks_per_sm(gate_up, nkb);
    const char* down = gate_up ? nullptr : std::getenv("DEEPINFER_CUDA_FEW_TOKENS_DOWN_PER_SM");
    if (down && *down) {
        per_sm = std::atoll(down);
        DI_CHECK(per_sm >= 1 && per_sm <= 3, "DEEPINFER_CUDA_FEW_TOKENS_DOWN_PER_SM must be 1-3, not '", down, "'");
    }
    return per_sm * device_sm_count();
}

template <bool kGateUp>
void launch_product(const FewTokensParams& p, int64_t slots, bool persistent, cudaStream_t stream) {
    const KSplit ks = k_split(p.k);
    const int64_t items = slots * (p.n / (kGateUp ? 8 : 16));
    DI_ICHECK(items < INT32_MAX, "routed_experts_few_tokens: ", items, " items");
    const int64_t blocks = persistent ? std::min<int64_t>(items, few_tokens_grid(kGateUp, ks.nkb)) : items;
    const int per = static_cast<int>(ceil_div(items, blocks));
    const dim3 grid(static_cast<unsigned>(ceil_div(items, per)));
    const int threads = 32 * ks.warps;
    const size_t smem = static_cast<size_t>(2 * p.k + 2 * ks.warps * 16 * 4);
    const int n_items = static_cast<int>(items);
    switch (ks.nkb) {
        case 1:
            launch_pdl(few_tokens_kernel<kGateUp, 1>, grid, threads, smem, stream, p, n_items, per);
            break;
        case 2:
            launch_pdl(few_tokens_kernel<kGateUp, 2>, grid, threads, smem, stream, p, n_items, per);
            break;
        default:
            launch_pdl(few_tokens_kernel<kGateUp, 4>, grid, threads, smem, stream, p, n_items, per);
            break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool routed_experts_few_tokens_applies(int64_t d, int64_t inter) {
    return k_split(d).warps > 0 && k_split(inter).warps > 0 && inter % 8 == 0 && d % 16 == 0;
}

void launch_routed_experts_few_tokens(float* out, const float* x, const int32_t* expert_of_row, int64_t rows,
                                      int rows_per_input, const void* device_table, int num_experts, int64_t d,
                                      int64_t inter, float swiglu_limit, cudaStream_t stream) {
    DI_ICHECK(routed_experts_few_tokens_applies(d, inter) && rows_per_input > 0 && rows % rows_per_input == 0 &&
                  rows <= 65535 && num_experts > 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "routed_experts_few_tokens: ", rows, " rows (", rows_per_input, " per input), D ", d, ", I ", inter);
    if (rows == 0) return;
    uint16_t* h = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&h), static_cast<size_t>(rows * inter) * 2, stream));
    // gate/up: x -> h (bf16, perm8); down: h -> out.
    const FewTokensParams gate_up{static_cast<const ExpertPtrs*>(device_table),
                                  num_experts,
                                  expert_of_row,
                                  rows_per_input,
                                  x,
                                  nullptr,
                                  h,
                                  nullptr,
                                  static_cast<int>(d),
                                  static_cast<int>(inter),
                                  swiglu_limit};
    const bool persistent = few_tokens_persistent();
    launch_product<true>(gate_up, rows, persistent, stream);
    FewTokensParams down = gate_up;
    down.x = nullptr, down.h_in = h, down.h_out = nullptr, down.out = out;
    down.k = static_cast<int>(inter), down.n = static_cast<int>(d);
    launch_product<false>(down, rows, persistent, stream);
    DI_CUDA_CHECK(cudaFreeAsync(h, stream));
}

}  // namespace deepinfer::cuda
