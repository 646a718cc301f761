// Sparse shared-KV attention on wgmma (Hopper sm_90a) for prefill: 64 heads of V4's 512-wide K=V rows, the keys
// staged from the bf16 copy of the key table. launch_sparse_attention_tc hands a call here when
// sparse_attention_wgmma_applies (table staging, no split, not batch-invariant); the results match the mma.sync
// kernel's numerics (q, keys and P rounded to bf16, fp32 logits, softmax and accumulation) but not bit for bit (the
// sums run in another order), so batch-invariant mode, whose decode rows take the mma.sync kernel, stays there.
//
// A query row is two GEMMs with the heads as M: S [64, keys] = Q K^T and O [64, 512] += P V, V = K. A persistent
// CTA (one an SM: 212 KB of shared memory) takes (row, 64-head group) items in turn with three warpgroups:
//  - the producer copies key tiles of 32 keys (32 KB of bf16) by cp.async through the index list into a ring of 4,
//    running ahead into the next items;
//  - two consumer warpgroups convert each item's queries (64 x 512 fp32, 128 KB, prefetched into L2 during the
//    item before's last pair) to bf16 in shared memory, both at once between items (the producer alone took four
//    HBM round trips: attention_bench's times fit ~18 us a CTA an item besides ~2.6 us a pair of tiles), and take
//    the item's tiles in pairs: warpgroup w computes S for tile 2 i + w (32 SS
//    wgmmas m64n32k16 over d), the two exchange their row maxima through shared memory (one named barrier), both
//    scale their O halves by the same exp(m_old - m_new), write P (bf16) to shared memory, meet again and each
//    multiplies both tiles' P into its 256 output columns (4 SS wgmmas m64n256k16, V read as an MN-major B
//    from the same tile: the 128-byte swizzled [64-column block][key][128 bytes] layout serves both products).
//    The next pair's S is issued right behind this PV, so the tensor cores run it while this PV drains, and a
//    pair's tiles go back to the producer as soon as its PV completes (wait_group 1), a whole S earlier.
// Each warpgroup keeps the denominator of its own keys; the two are added at the end (their rescales are equal),
// where the sink joins as in attention_tc.cu and O is normalised and written from the accumulators.
// Earlier forms of this loop made ptxas serialize every wgmma (warnings C7514, C7515, C7518): S products inside a
// per-warpgroup branch, O zeroed at an item's start while the item before's products could still be in flight (in
// ptxas's view), the mask written into S's own registers. Hence the masked S of a missing tile, O overwritten by an
// item's first PV, and the logits' copy (lg); check `-Xptxas -v` after changing the loop.
//
// Cost (H200, ~4,096 bf16 FLOP a clock an SM on wgmma): 32 keys x 64 heads x 2 x 512 x 2 = 4.2 MFLOP of tensor
// work a tile (~1,000 clocks). Shared memory limits the S products: each m64n32k16 reads A (2 KB of Q) and B (1 KB)
// for 65.5 KFLOP, 192 bytes a clock at the tensor rate against the SM's 128; a pair of tiles moves ~264 KB through
// shared memory (~2,060 clocks) for 8.4 MFLOP (~2,050 clocks of tensor work), so at most ~50% of the tensor rate,
// plus the softmax between the products. The queries cost 128 KB of HBM an item (~4,000 clocks of an SM's share of
// the bandwidth) and stall the consumers between items: prefetched into L2 a pair ahead, loaded 64 KB a round trip.
// Measured before this form (H200, attention_bench; the producer loading the queries 32 KB a round trip after the
// item before's last S): 236 TFLOP/s at 16,384 rows of ~607 keys (5.52 ms; the mma.sync kernel 9.38), ~7,700 clocks
// a pair on average against the ~3,000 counted above; the two prefill shapes fit ~18 us a CTA an item besides ~2.6
// us (~4,600 clocks) a pair. ncu (2,048 rows): 3 warps a scheduler issuing 0.38 a cycle, SM busy 36%, the top stall
// the producer's global loads. With the consumers loading the queries (run 35): 4.36 ms at 16,384 rows (299
// TFLOP/s), 424 us at 2,048.
//
// Backend::rotary_attention_rows (V4's model call) also hands over the queries' per-head RMSNorm and RoPE and the
// output's inverse RoPE (AttnRope): the consumers norm each head as they load it (a warp a head, lane l holding
// float4s l + 32 u, which is rms_norm_warp_kernel's order of sums) and rotate its last dims by a [row, pair]
// (cos, sin) table that launch_rope_table writes first (rope_kernel's values); the epilogue rotates warpgroup 1's
// last columns back from that row's copy in shared memory. The output is bitwise the norm, RoPE, attention and
// inverse RoPE run apart (the CUDA op test checks), with q's 2 GB at V4-Flash's 16,384 rows read once instead of
// three times and never written: attention_bench 4.72 ms against 5.83 for the four kernels (run 38). ptxas spills 20
// bytes of the consumer with both rotations in (none with either alone).
//
// With the rotation the output may also be written in bf16 (AttnRope::out_bf16: each value rounded to nearest even,
// as launch_to_bf16 rounds it) for a consumer that rounds its input to bf16 anyway (wo_a's cuBLAS products): at
// V4-Flash's 16,384 rows that writes 1 GB a layer instead of 2 GB, and saves the product's 2 GB read and 1 GB write
// of its own conversion. The queries may come in bf16 too (AttnRope::q_bf16: wq_b's cuBLAS product writes them so),
// widened exactly as they are loaded: the same arithmetic from there, on half the bytes.
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/norm_rows.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/wgmma_common.cuh"
#include "backend/cuda/wgmma_ss.cuh"

namespace deepinfer::cuda {

namespace {

using namespace wgmma;

constexpr int kD = 512;                // head dim: V4's shared K=V row
constexpr int kHeads = 64;             // heads of an item: wgmma's M
constexpr int kTileKeys = 32;          // keys of a staged tile (one consumer warpgroup's S)
constexpr int kSlots = 4;              // key tiles in the ring (two pairs)
constexpr int kConsumerThreads = 256;  // two warpgroups
constexpr int kProducerThreads = 128;  // one warpgroup
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kConsumerWarps = kConsumerThreads / 32;
// setmaxnreg moves registers between the warpgroups of the launch allocation (168 a thread at 384 threads).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8, kProducerRegs = 88, kConsumerRegs = 208;
constexpr int kQHeads = 2;          // heads of the queries a consumer warp loads at once (32 registers; o stays live)
constexpr int kQVec = kD / 4 / 32;  // float4s of a head a lane holds
constexpr int kMaxRopePairs = 64;   // rotary dims within a lane's last float4s (kD - 128 .. kD)
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * kLaunchRegs, "register file");

// Shared memory, from a 1024-byte aligned base: every operand is [64-column block][row][128 bytes] under the
// 128-byte swizzle (16-byte piece p of row r at r * 128 + ((p ^ (r % 8)) * 16)).
constexpr uint32_t kQBlock = kHeads * 128;          // one 64-column block of Q: 8 KB
constexpr uint32_t kKBlock = kTileKeys * 128;       // one 64-column block of a key tile: 4 KB
constexpr uint32_t kQBytes = kD / 64 * kQBlock;     // 64 KB
constexpr uint32_t kTileBytes = kD / 64 * kKBlock;  // 32 KB
constexpr uint32_t kPBytes = kHeads * 128;          // P of one tile: [head][128 bytes], keys in the first 64
constexpr uint32_t kOffTiles = kQBytes, kOffP = kOffTiles + kSlots * kTileBytes, kOffRed = kOffP + 2 * kPBytes;
// Row maxima [2][64], denominators [2 rounds][2][64], the output's rotation [2 rounds][pair] (cos, sin).
constexpr uint32_t kRedFloats = 2 * kHeads + 2 * 2 * kHeads + 2 * 2 * kMaxRopePairs;
constexpr uint32_t kOffBars = kOffRed + kRedFloats * 4;
constexpr int kBars = 2 * kSlots;  // full[kSlots], empty[kSlots]
constexpr int kSmemBytes = 1024 + kOffBars + kBars * 8;
static_assert(kSmemBytes <= 227 * 1024, "shared memory");
static_assert(kOffP % 1024 == 0 && kTileBytes % 1024 == 0, "operands keep the swizzle atoms 1024-byte aligned");

// Items stay int, and so does a CTA's item counter stepping past the last one by up to a grid.
constexpr int64_t kMaxItems = (int64_t{1} << 31) - (int64_t{1} << 20);

struct WgAttnParams {
    void* out;                   // [T, H, 512] f32, or bf16 where out_bf16
    const void* q;               // [T, H, 512] f32, or bf16 where q_bf16; 16-byte aligned
    const __nv_bfloat16* table;  // [Nk, 512] bf16: the keys rounded
    const int32_t* offsets;      // [T + 1] row t attends keys indices[offsets[t] .. offsets[t + 1])
    const int32_t* indices;      // rows of the table
    const float* sinks;          // [H] per-head sink logits
    int rows, heads, groups;     // groups = heads / 64: items are (row, group), row-major
    float scale;
    // With rotation: each query head RMS-normed (eps) and its dims rope_col0 .. 512 rotated as it is loaded, and
    // the output rotated back as it is written (Backend::rotary_attention_rows); s times the sign, as rope_kernel's.
    const float2* rotation;  // [T, rope_pairs] (cos, sin) of each row's pairs (launch_rope_table), or null
    int rope_col0, rope_pairs;
    float eps, q_sign, out_sign;
    bool out_bf16, q_bf16;
};

__device__ __forceinline__ uint32_t sw128(int row, int piece) {
    return static_cast<uint32_t>(row * 128 + ((piece ^ (row & 7)) << 4));
}
__device__ __forceinline__ void named_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool on) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::
            "r"(bar),
        "r"(static_cast<int>(on))
        : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, uint32_t a, uint32_t b) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(a), "r"(b) : "memory");
}

// Query elements i .. i + 3 as floats: f32 as stored, or bf16 widened (exact).
__device__ __forceinline__ float4 load_q4(const WgAttnParams& p, int64_t i) {
    if (!p.q_bf16) return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + i));
    const uint2 b = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.q) + i));
    return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u), __uint_as_float(b.y << 16),
                       __uint_as_float(b.y & 0xffff0000u));
}

// The producer warpgroup: key tiles into the ring.
__device__ __forceinline__ void produce(const WgAttnParams& p, uint32_t tiles, uint32_t bars) {
    const int tid = threadIdx.x - kConsumerThreads;
    // This thread copies 16-byte piece `piece` (columns 8 piece ..) of keys key0, key0 + 2, ... of every tile.
    const int piece = tid % 64, key0 = tid / 64;
    const uint32_t piece_base = (piece / 8) * kKBlock;
    uint32_t issued = 0;  // tiles issued by this CTA: the ring position
    for (int item = blockIdx.x; item < p.rows * p.groups; item += gridDim.x) {
        const int row = item / p.groups;
        const int begin = __ldg(p.offsets + row), len = __ldg(p.offsets + row + 1) - begin;
        const int ntiles = (len + kTileKeys - 1) / kTileKeys;
        // The rows of this thread's keys of the next tile, loaded a tile ahead: their L2 round trip overlaps the
        // wait for a free slot instead of preceding each copy.
        int next[kTileKeys / 2];
        auto load_rows = [&](int t) {
#pragma unroll
            for (int i = 0; i < kTileKeys / 2; ++i) {
                const int k = t * kTileKeys + key0 + 2 * i;
                next[i] = t < ntiles && k < len ? __ldg(p.indices + begin + k) : -1;
            }
        };
        load_rows(0);
        auto issue_tile = [&](int t) {
            int r[kTileKeys / 2];
#pragma unroll
            for (int i = 0; i < kTileKeys / 2; ++i) r[i] = next[i];
            load_rows(t + 1);
            const uint32_t slot = issued % kSlots;
            mbar_wait(bars + 8 * (kSlots + slot), ((issued / kSlots) & 1) ^ 1);
            const uint32_t dst = tiles + slot * kTileBytes + piece_base;
#pragma unroll
            for (int i = 0; i < kTileKeys / 2; ++i) {
                const __nv_bfloat16* src = r[i] >= 0 ? p.table + static_cast<int64_t>(r[i]) * kD + 8 * piece : p.table;
                mma::cp_async16(dst + sw128(key0 + 2 * i, piece % 8), src, r[i] >= 0 ? 16u : 0u);  // past the list: 0
            }
            cp_async_arrive_noinc(bars + 8 * slot);
            ++issued;
        };
        for (int t = 0; t < ntiles; ++t) issue_tile(t);
    }
    mma::cp_async_wait_all();
}

// The two consumer warpgroups.
__device__ __forceinline__ void consume(const WgAttnParams& p, uint32_t qs, uint32_t tiles, uint32_t ps, float* red,
                                        uint32_t bars) {
    static_assert(kQVec == 4 && kHeads % (kConsumerWarps * kQHeads) == 0, "the query load's shape");
    const int w = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const bool leader = lane == 0;
    auto full = [&](uint32_t tile) { return bars + 8 * (tile % kSlots); };
    auto empty = [&](uint32_t tile) { return bars + 8 * (kSlots + tile % kSlots); };
    auto phase = [](uint32_t tile) { return (tile / kSlots) & 1; };
    auto tile_at = [&](uint32_t tile) { return tiles + (tile % kSlots) * kTileBytes; };
    float* red_max = red;               // [2][64]: each warpgroup's tile maxima
    float* red_sum = red + 2 * kHeads;  // [round % 2][2][64]: each warpgroup's denominators
    float2* rope_tab = reinterpret_cast<float2*>(red + 6 * kHeads);  // [round % 2][pair]: the output's rotation
    const int head0 = warp * 16 + g;  // this thread's rows: heads head0 and head0 + 8 of the item

    float o[128];  // O [64, 256 w .. + 256]: d[4 j + v] = head head0 + 8 (v >> 1), column 256 w + 8 j + 2 c + (v & 1)
    uint32_t seen = 0;  // tiles consumed by this CTA: the ring position
    uint32_t round = 0;
    for (int item = blockIdx.x; item < p.rows * p.groups; item += gridDim.x, ++round) {
        const int row = item / p.groups, h0 = (item % p.groups) * kHeads;
        const int begin = __ldg(p.offsets + row), len = __ldg(p.offsets + row + 1) - begin;
        const int ntiles = (len + kTileKeys - 1) / kTileKeys, npairs = (ntiles + 1) / 2;
        // o is not zeroed here (ptxas would serialize the wgmmas): the item's first PV overwrites it.
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
        // This row's [pair] (cos, sin) of the rotation. The output's is copied to shared memory (whence the epilogue
        // loads it as it goes, keeping its registers), read after this item's query barrier and overwritten two
        // items on, past the next one's.
        const float2* rot = p.rotation + static_cast<int64_t>(row) * p.rope_pairs;
        if (p.rotation && threadIdx.x < p.rope_pairs)
            rope_tab[(round & 1) * kMaxRopePairs + threadIdx.x] = __ldg(rot + threadIdx.x);
        // The item's queries, converted to bf16 by both warpgroups, kQHeads heads a warp at once (16 16-byte loads
        // in flight a thread, 64 KB a round trip; the producer's one warpgroup needed four), lane l holding float4s
        // l + 32 u of a head as rms_norm_warp_kernel does, so that their norm sums in its order. The item before's
        // last S is complete in both warpgroups: each waited for its own before that pair's first named barrier.
        if (npairs > 0) {
            const int cw = threadIdx.x / 32;  // consumer warp: heads hb + cw + 8 k
            // The rotation of this lane's last float4 of each head (columns 4 (96 + lane) ..: pairs 2 rope_vec, + 1).
            const int rope_vec = (kQVec - 1) * 32 + lane - p.rope_col0 / 4;  // >= 0: a float4 of rotated pairs
            // element index of this lane's first value of the item's head 0
            const int64_t qitem = (static_cast<int64_t>(row) * p.heads + h0) * kD + 4 * lane;
#pragma unroll 1
            for (int hb = 0; hb < kHeads; hb += kConsumerWarps * kQHeads) {
                float4 v[kQHeads][kQVec];
#pragma unroll
                for (int k = 0; k < kQHeads; ++k)
#pragma unroll
                    for (int u = 0; u < kQVec; ++u) v[k][u] = load_q4(p, qitem + (hb + cw + 8 * k) * kD + 128 * u);
#pragma unroll
                for (int k = 0; k < kQHeads; ++k) {
                    const int h = hb + cw + 8 * k;
                    if (p.rotation) {  // rms_norm_warp_kernel's arithmetic, then rope_kernel's
                        float ss = sum_squares(v[k]);
                        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
                        const float inv = 1.0f / sqrtf(ss / static_cast<float>(kD) + p.eps);
#pragma unroll
                        for (int u = 0; u < kQVec; ++u) v[k][u] = normed4(v[k][u], inv, nullptr, 0);
                        if (rope_vec >= 0) {
                            const float4 cs = __ldg(reinterpret_cast<const float4*>(rot + 2 * rope_vec));
                            rotate_by(v[k][kQVec - 1].x, v[k][kQVec - 1].y, cs.x, cs.y * p.q_sign);
                            rotate_by(v[k][kQVec - 1].z, v[k][kQVec - 1].w, cs.z, cs.w * p.q_sign);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < kQVec; ++u) {
                        const int i = lane + 32 * u;  // float4 i: columns 4 i .. 4 i + 3
                        st_shared_v2(qs + (i / 16) * kQBlock + sw128(h, (i % 16) / 2) + (i % 2) * 8,
                                     mma::pack_bf16(v[k][u].x, v[k][u].y), mma::pack_bf16(v[k][u].z, v[k][u].w));
                    }
                }
            }
            fence_proxy_async();  // generic-proxy stores read by the wgmmas
        }
        named_bar_sync(1, kConsumerThreads);

        // S of pair pr into s: warpgroup w multiplies tile 2 pr + w; one without a tile (the second of an odd
        // count) multiplies tile a again and masks it all, so the products stay outside divergent code.
        float s[16];
        auto issue_s = [&](int pr) {
            const uint32_t ta = seen + 2 * pr, tm = w == 0 || 2 * pr + 1 < ntiles ? ta + w : ta;
            mbar_wait(full(tm), phase(tm));
            fence_proxy_async();
            const uint32_t kt = tile_at(tm);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks) {
                const uint32_t at = (ks % 4) * 32;  // k16 step within the 64-column block
                WgmmaSS<32, false>::mma(s, sw128_desc(qs + (ks / 4) * kQBlock + at, 16, 1024),
                                        sw128_desc(kt + (ks / 4) * kKBlock + at, 16, 1024), ks > 0);
            }
            wgmma_commit();
        };
        if (npairs > 0) issue_s(0);

#pragma unroll 1
        for (int pr = 0; pr < npairs; ++pr) {
            const uint32_t ta = seen + 2 * pr;
            const bool has_b = 2 * pr + 1 < ntiles, mine = w == 0 || has_b;
            const int n = mine ? min(kTileKeys, len - (2 * pr + w) * kTileKeys) : 0;  // keys of this warpgroup's tile
            // The pair before's PV was committed before this S: its tiles go back to the producer as soon as it
            // completes, while this S still runs.
            wgmma_wait<1>();
            // Predicated arrivals while S is in flight (the leader lanes, from the second pair on).
            mbar_arrive_if(empty(ta - 2), pr > 0 && leader);  // a pair before the last has both tiles
            mbar_arrive_if(empty(ta - 1), pr > 0 && leader);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 16; ++i) pin(s[i]);
#pragma unroll
            for (int i = 0; i < 128; ++i) pin(o[i]);
            if (pr == npairs - 1 && item + static_cast<int>(gridDim.x) < p.rows * p.groups) {
                // The next item's queries (128 contiguous KB; 64 in bf16) into L2 now, so that its loads wait on L2,
                // not HBM.
                const int next = item + static_cast<int>(gridDim.x);
                const int qbytes = p.q_bf16 ? 2 : 4;
                const char* qn =
                    static_cast<const char*>(p.q) +
                    (static_cast<int64_t>(next / p.groups) * p.heads + (next % p.groups) * kHeads) * kD * qbytes;
                const int ct = threadIdx.x % kConsumerThreads;
#pragma unroll
                for (int i = 0; i < kHeads * kD * 4 / 128 / kConsumerThreads; ++i)
                    if (i < kHeads * kD * qbytes / 128 / kConsumerThreads)
                        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(qn + 128 * (ct + kConsumerThreads * i)));
            }

            // Scaled logits (-inf past the tile's keys; a copy: s stays the wgmmas' alone, or ptxas serializes them)
            // and this warpgroup's row maxima.
            float lg[16], mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const int key = 8 * j + 2 * c + (v & 1);
                    lg[4 * j + v] = key < n ? s[4 * j + v] * p.scale : -INFINITY;
                    mx[v >> 1] = fmaxf(mx[v >> 1], lg[4 * j + v]);
                }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
                mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
                if (c == 0) red_max[w * kHeads + head0 + 8 * hr] = mx[hr];
            }
            named_bar_sync(1, kConsumerThreads);

            // The pair's maximum (equal in both warpgroups), P = exp(s - m) rounded to bf16, the rounded P's sums.
            float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int h = head0 + 8 * hr;
                const float m_new = fmaxf(m_run[hr], fmaxf(red_max[h], red_max[kHeads + h]));
                alpha[hr] = expf(m_run[hr] - m_new);  // 0 on the first pair (m_run = -inf); tile a has keys
                m_run[hr] = m_new;
            }
            uint32_t pk[8];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int key = 8 * j + 2 * c;
                    const float p0 = key < n ? expf(lg[4 * j + 2 * hr] - m_run[hr]) : 0.0f;
                    const float p1 = key + 1 < n ? expf(lg[4 * j + 2 * hr + 1] - m_run[hr]) : 0.0f;
                    const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
                    sum[hr] += __low2float(pb) + __high2float(pb);
                    pk[2 * j + hr] = *reinterpret_cast<const uint32_t*>(&pb);
                }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                sum[hr] += __shfl_xor_sync(0xffffffffu, sum[hr], 1);
                sum[hr] += __shfl_xor_sync(0xffffffffu, sum[hr], 2);
                l_run[hr] = l_run[hr] * alpha[hr] + sum[hr];
            }
            const uint32_t pw = ps + w * kPBytes;  // zeros where this warpgroup has no tile
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) st_shared_b32(pw + sw128(head0 + 8 * hr, j) + 4 * c, pk[2 * j + hr]);
#pragma unroll
            for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
            fence_proxy_async();  // P: generic-proxy stores read by the other warpgroup's wgmmas
            named_bar_sync(1, kConsumerThreads);

            // O += P_a V_a + P_b V_b over this warpgroup's 256 columns (V: MN-major B, 64-column blocks 4 KB apart).
            // Without tile b, P_b is zero and V_b is tile a again (finite: 0 x V_b adds nothing).
            const uint32_t tb = has_b ? ta + 1 : ta, other = w == 0 ? tb : ta;
            mbar_wait(full(other), phase(other));
            fence_proxy_async();
            wgmma_fence();
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
                const uint32_t vt = tile_at(tt == 0 ? ta : tb) + w * 4 * kKBlock;
#pragma unroll
                for (int ks = 0; ks < kTileKeys / 16; ++ks)
                    WgmmaSS<256, true>::mma(o, sw128_desc(ps + tt * kPBytes + ks * 32, 16, 1024),
                                            sw128_desc(vt + ks * 16 * 128, kKBlock, 1024), pr + tt + ks > 0);
            }
            wgmma_commit();
            if (pr + 1 < npairs) issue_s(pr + 1);  // runs on the tensor cores behind this PV
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) pin(o[i]);
        if (npairs > 0 && leader) {  // the last pair's tiles
            const uint32_t ta = seen + 2 * (npairs - 1);
            mbar_arrive(empty(ta));
            if (2 * npairs == ntiles) mbar_arrive(empty(ta + 1));
        }
        seen += ntiles;

        // out = O exp(m - M) / L, with the sink joining M and L; L adds both warpgroups' denominators.
        float* sums = red_sum + (round & 1) * 2 * kHeads;
        if (c == 0) {
            sums[w * kHeads + head0] = l_run[0];
            sums[w * kHeads + head0 + 8] = l_run[1];
        }
        named_bar_sync(1, kConsumerThreads);
        float wgt[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int h = head0 + 8 * hr;
            const float l = sums[h] + sums[kHeads + h], m = m_run[hr], sink = __ldg(p.sinks + h0 + h);
            const float mx = fmaxf(sink, m);
            const float total = __fadd_rn(expf(sink - mx), __fmul_rn(l, expf(m - mx)));
            wgt[hr] = __fdiv_rn(expf(m - mx), total);
        }
        const int64_t orow = (static_cast<int64_t>(row) * p.heads + h0) * kD + 256 * w + 2 * c;  // element index
        // Column pair 256 w + 8 j + 2 c of both rows, rotated back when it is a rotary pair: those are in
        // warpgroup 1's last 128 columns (rope_col0 >= 384), so only there does the loop carry the rotation.
        const float2* tab = rope_tab + (round & 1) * kMaxRopePairs;
        auto put = [&](int j, bool rotary) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                // Only the sink: no O (o holds the item before's).
                float a = npairs == 0 ? 0.0f : __fmul_rn(wgt[hr], o[4 * j + 2 * hr]);
                float b = npairs == 0 ? 0.0f : __fmul_rn(wgt[hr], o[4 * j + 2 * hr + 1]);
                const int col = 256 * w + 8 * j + 2 * c;
                if (rotary && col >= p.rope_col0) {
                    const float2 cs = tab[(col - p.rope_col0) / 2];
                    rotate_by(a, b, cs.x, cs.y * p.out_sign);
                }
                const int64_t at = orow + (head0 + 8 * hr) * kD + 8 * j;
                if (p.out_bf16)
                    reinterpret_cast<uint32_t*>(p.out)[at / 2] = mma::pack_bf16(a, b);
                else
                    *reinterpret_cast<float2*>(static_cast<float*>(p.out) + at) = make_float2(a, b);
            }
        };
#pragma unroll
        for (int j = 0; j < 16; ++j) put(j, false);
        if (p.rotation && w == 1) {
#pragma unroll
            for (int j = 16; j < 32; ++j) put(j, true);
        } else {
#pragma unroll
            for (int j = 16; j < 32; ++j) put(j, false);
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1) sparse_attention_wgmma_kernel(const __grid_constant__ WgAttnParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // built without sm_90a: applies() asks for compute capability 9.0, so the build must include 90a
#else
    pdl_prologue();  // see pdl.cuh
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = mma::smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
    const uint32_t qs = base, tiles = base + kOffTiles, ps = base + kOffP, bars = base + kOffBars;
    float* red = reinterpret_cast<float*>(smem_raw + (base - raw) + kOffRed);
    if (threadIdx.x == 0) {
        // full: the producer threads' cp.async arrivals; empty: each consumer warp once
        mbar_init_ring(bars, kSlots, kProducerThreads, kConsumerWarps);
    }
    __syncthreads();
    if (threadIdx.x >= kConsumerThreads) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        produce(p, tiles, bars);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    consume(p, qs, tiles, ps, red, bars);
#endif
}

bool wgmma_attention_enabled() {
    const char* v = std::getenv("DEEPINFER_CUDA_ATTN_WGMMA");  // read per call: benchmarks and tests switch it
    return !v || std::strcmp(v, "0") != 0;
}

}  // namespace

bool sparse_attention_wgmma_applies(int64_t rows, int64_t heads, int64_t d, bool batch_invariant, bool table,
                                    const void* q, const void* out) {
    return !batch_invariant && table && d == kD && heads > 0 && heads % kHeads == 0 &&
           rows * (heads / kHeads) >= device_sm_count() && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(out) % 8 == 0 && rows * (heads / kHeads) <= kMaxItems &&
           device_compute_capability() == 90 && wgmma_attention_enabled();
}

bool sparse_attention_wgmma_takes_rope(int rope_dim) {
    return rope_dim > 0 && rope_dim % 4 == 0 && rope_dim <= 2 * kMaxRopePairs;
}

void launch_sparse_attention_wgmma(void* out, const void* q, const uint16_t* table, const int32_t* offsets,
                                   const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, float scale,
                                   cudaStream_t stream, const AttnRope* rope) {
    const int64_t items = rows * (heads / kHeads);
    if (items == 0) return;
    DI_ICHECK(items <= kMaxItems, "sparse_attention_wgmma: too many rows");
    DI_ICHECK(!rope || sparse_attention_wgmma_takes_rope(rope->rope_dim), "sparse_attention_wgmma: rope_dim ",
              rope ? rope->rope_dim : 0);
    float2* rotation = nullptr;  // [rows, rope_dim / 2]: each row's (cos, sin), as rope_kernel computes them
    if (rope) {
        DI_CUDA_CHECK(
            cudaMallocAsync(reinterpret_cast<void**>(&rotation), rows * rope->rope_dim / 2 * sizeof(float2), stream));
        launch_rope_table(rotation, rope->positions, rope->inv_freq, rows, rope->rope_dim / 2, rope->attention_factor,
                          stream);
    }
    static std::atomic<uint64_t> configured{0};
    allow_smem(sparse_attention_wgmma_kernel, kSmemBytes, configured);
    const WgAttnParams p{out,
                         q,
                         reinterpret_cast<const __nv_bfloat16*>(table),
                         offsets,
                         indices,
                         sinks,
                         static_cast<int>(rows),
                         static_cast<int>(heads),
                         static_cast<int>(heads / kHeads),
                         scale,
                         rotation,
                         rope ? kD - rope->rope_dim : kD,
                         rope ? rope->rope_dim / 2 : 0,
                         rope ? rope->eps : 0.0f,
                         1.0f,
                         -1.0f,
                         rope && rope->out_bf16,
                         rope && rope->q_bf16};
    const int grid = static_cast<int>(std::min<int64_t>(items, device_sm_count()));
    launch_pdl(sparse_attention_wgmma_kernel, dim3(grid), dim3(kThreads), kSmemBytes, stream, p);
    if (rotation) DI_CUDA_CHECK(cudaFreeAsync(rotation, stream));
}

}  // namespace deepinfer::cuda
