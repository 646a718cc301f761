// Sparse shared-KV attention with sinks, and the lightning indexer's scores. fp32 SIMT throughout: both match
// the CPU oracle to fp32 summation noise.
//
// sparse_attention: every head attends over the same K=V rows, so a block stages a tile of 32 of a row's keys
// in shared memory once and uses it for a group of HG heads: scores S[HG, 32] = Q K^T, an online softmax per
// head, then out[HG, d] += P K. When (rows x head groups) alone cannot fill the GPU (decode), a row's key list is
// also split over a cluster of up to 8 blocks (flash-decoding); the blocks merge their partial softmax states
// through distributed shared memory in rank order, so results are deterministic. Batch-invariant mode never
// splits, so a row's result does not depend on how many rows share the call.
//
// indexer_scores: scores[t, e] = scale * sum_h w[t, h] * relu(q[t, h] . k[e]). A block owns a tile of 4 * NE
// entries (staged once) and a run of rows; per row it stages q[t] ([Hi, c], 32 KB for V4) and each warp takes
// 8 heads at a time: the 8 lanes of a group split c, the 4 groups take NE entries each, so every q float4 read
// from shared memory serves NE entries and every key float4 serves 8 heads. No choice of tile changes the
// summation order of an output, so the op is batch-invariant by construction.
#include <algorithm>
#include <atomic>

#include "backend/cuda/attention_merge.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kKeyTile = 32;     // keys per staged tile: 4 per warp in the product, one per lane in the softmax
constexpr int kMaxSplits = 8;    // portable cluster size
constexpr int kMaxHeadDim = 1024;



__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// Sums each of the V values of `a` over the 2M lanes that differ in lane bits M, M/2, .., 1 (M a power of two,
// <= 16; V a power of two or a multiple of 2M), exchanging half of the values per step rather than all of them. Afterwards a[i], i < max(1, V / 2M),
// holds the sum of value v = (lane % 2M) * max(1, V / 2M) / max(1, 2M / V) + i. Every value is summed over
// the same tree (pairs by lane bit M first), whatever V is, so the sums do not depend on V.
template <int V, int M, int N = V>
__device__ __forceinline__ void transpose_sum(float (&a)[V], int lane) {
    if constexpr (M > 0 && N > 1) {  // a compile-time recursion, so that `a` stays in registers
        const bool upper = lane & M;
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const float mine = upper ? a[i + N / 2] : a[i], theirs = upper ? a[i] : a[i + N / 2];
            a[i] = mine + __shfl_xor_sync(0xffffffffu, theirs, M);
        }
        transpose_sum<V, M / 2, N / 2>(a, lane);
    } else {
#pragma unroll
        for (int m = M; m > 0; m >>= 1) a[0] += __shfl_xor_sync(0xffffffffu, a[0], m);
    }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Copies `rows` rows of d floats into shared memory rows of `ld` floats (ld a multiple of 4), zero beyond d;
// row_ptr(r) gives the source row, or nullptr for a row of zeros. The float4 path (d % 4 == 0, sources 16-byte
// aligned) issues every copy asynchronously, so a tile costs one memory latency: the caller waits with
// cp_async_wait_all() and then synchronizes the block.
template <class RowPtr>
__device__ __forceinline__ void stage_rows(float* dst, int rows, int ld, int d, bool vec, RowPtr row_ptr) {
    if (vec) {
        // Float4 i = r * q4 + c4, i = tid, tid + 256, ..: (r, c4) advance without a division per copy.
        const int q4 = ld / 4, d4 = d / 4, step_r = kThreads / q4, step_c = kThreads % q4;
        int r = threadIdx.x / q4, c4 = threadIdx.x % q4;
        while (r < rows) {
            float4* to = reinterpret_cast<float4*>(dst + r * ld) + c4;
            const float* src = row_ptr(r);
            if (src && c4 < d4) cp_async16(to, reinterpret_cast<const float4*>(src) + c4);
            else *to = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            r += step_r, c4 += step_c;
            if (c4 >= q4) c4 -= q4, ++r;
        }
    } else {
        for (int i = threadIdx.x; i < rows * ld; i += kThreads) {
            const int r = i / ld, c = i - r * ld;
            const float* src = row_ptr(r);
            dst[r * ld + c] = src && c < d ? __ldg(src + c) : 0.0f;
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

struct AttnParams {
    float* out;              // [T, H, d] f32
    const float* q;          // [T, H, d] f32
    const float* keys;       // [Nk, d] f32, the shared K=V rows
    const int32_t* offsets;  // [T + 1] row t attends keys indices[offsets[t] .. offsets[t + 1])
    const int32_t* indices;  // [offsets[T]] rows of keys
    const float* sinks;      // [H] per-head sink logits
    int heads, d;
    int ld;                  // floats per staged row: CPT * 256 >= d
    int splits;              // cluster size: blocks sharing one (row, head group)'s key list
    int vec;                 // d % 4 == 0 and q, keys 16-byte aligned: stage with float4 loads
    float scale;
};

// Shared memory of the attention kernel, in floats.
constexpr int attn_smem_floats(int hg, int ld) {
    return hg * ld + kKeyTile * ld + 2 * hg * kKeyTile + 3 * hg + kMaxSplits * hg;
}

// Grid: (rows * splits, head groups), cluster (splits, 1, 1). Thread tid owns output columns tid + 256 j
// (j < CPT) of the group's HG heads. HG <= 8 (one warp per head in the softmax step).
template <int HG, int CPT>
__global__ void __launch_bounds__(kThreads, CPT <= 2 ? 2 : 1) sparse_attention_kernel(AttnParams p) {
    extern __shared__ float4 smem4[];
    const int ld = p.ld;
    float* qs = reinterpret_cast<float*>(smem4);  // [HG, ld] the group's queries
    float* ks = qs + HG * ld;                     // [kKeyTile, ld] a tile of keys; at the end the partial output
    float* sc = ks + kKeyTile * ld;               // [HG, kKeyTile] scaled logits
    float* ps = sc + HG * kKeyTile;               // [kKeyTile, HG] probabilities, key-major for float4 reads
    float* alpha = ps + kKeyTile * HG;            // [HG] rescale of the running output by this tile
    float* ml = alpha + HG;                       // [2, HG] this block's running max and denominator
    float* wts = ml + 2 * HG;                     // [kMaxSplits, HG] each rank's weight in the merge

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int splits = p.splits, rank = blockIdx.x % splits, row = blockIdx.x / splits;
    const int h0 = blockIdx.y * HG, nh = min(HG, p.heads - h0), d = p.d;
    const int begin = p.offsets[row], len = p.offsets[row + 1] - begin;
    const int chunk = (len + splits - 1) / splits;
    const int kb = begin + min(len, rank * chunk), ke = begin + min(len, (rank + 1) * chunk);

    const float* qrow = p.q + (static_cast<int64_t>(row) * p.heads + h0) * d;
    stage_rows(qs, HG, ld, d, p.vec, [&](int h) { return h < nh ? qrow + static_cast<int64_t>(h) * d : nullptr; });

    float acc[HG][CPT] = {};
    float m_run = -INFINITY, l_run = 0.0f;  // warp h < HG: head h's running max and denominator
    const int nch = (d + 3) / 4;            // float4s of a row that hold data
    __shared__ int key_rows[kKeyTile];      // the tile's rows of keys
    for (int k0 = kb; k0 < ke; k0 += kKeyTile) {
        const int n = min(kKeyTile, ke - k0);
        __syncthreads();  // the previous tile is consumed
        if (tid < n) key_rows[tid] = p.indices[k0 + tid];
        __syncthreads();
        stage_rows(ks, kKeyTile, ld, d, p.vec,
                   [&](int k) { return k < n ? p.keys + static_cast<int64_t>(key_rows[k]) * d : nullptr; });
        cp_async_wait_all();  // this tile's keys (and, on the first tile, the queries)
        __syncthreads();

        // S = Q K^T: warp w takes keys 4w .. 4w+3 for all HG heads, its lanes split d; then one lane per
        // (head, key) ends with the full dot product.
        float s[HG * 4] = {};
        const float4* q4 = reinterpret_cast<const float4*>(qs);
        const float4* k4 = reinterpret_cast<const float4*>(ks + 4 * warp * ld);
        for (int ch = lane; ch < nch; ch += 32) {
            float4 kv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) kv[i] = k4[i * ld / 4 + ch];
#pragma unroll
            for (int h = 0; h < HG; ++h) {
                const float4 qv = q4[h * ld / 4 + ch];
#pragma unroll
                for (int i = 0; i < 4; ++i) s[h * 4 + i] = dot4(qv, kv[i], s[h * 4 + i]);
            }
        }
        transpose_sum<HG * 4, 16>(s, lane);
        constexpr int kLanesPerValue = 32 / (HG * 4);
        if (lane % kLanesPerValue == 0) {
            const int v = lane / kLanesPerValue, h = v / 4, i = v % 4;
            sc[h * kKeyTile + 4 * warp + i] = s[0] * p.scale;
        }
        __syncthreads();

        // Online softmax: warp h updates head h, one key per lane.
        if (warp < HG) {
            const float x = lane < n ? sc[warp * kKeyTile + lane] : -INFINITY;
            const float m_new = fmaxf(m_run, warp_max(x));
            const float e = lane < n ? expf(x - m_new) : 0.0f;
            const float a = expf(m_run - m_new);  // 0 on the first tile (m_run = -inf)
            l_run = l_run * a + warp_sum(e);
            m_run = m_new;
            ps[lane * HG + warp] = e;
            if (lane == 0) alpha[warp] = a;
        }
        __syncthreads();

        // out = out * alpha + P K over the tile's keys.
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            const float a = alpha[h];
#pragma unroll
            for (int j = 0; j < CPT; ++j) acc[h][j] *= a;
        }
#pragma unroll 4
        for (int k = 0; k < n; ++k) {
            float pk[HG];
#pragma unroll
            for (int h = 0; h < HG; h += 4) {
                const float4 v = reinterpret_cast<const float4*>(ps + k * HG)[h / 4];
                pk[h] = v.x, pk[h + 1] = v.y, pk[h + 2] = v.z, pk[h + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const float kv = ks[k * ld + tid + j * kThreads];
#pragma unroll
                for (int h = 0; h < HG; ++h) acc[h][j] = fmaf(pk[h], kv, acc[h][j]);
            }
        }
    }

    // Merge the cluster's partial states: out = sum_r exp(m_r - M) acc_r / L, with the sink joining M and L.
    cp_async_wait_all();  // the queries' copies, when this block had no keys
    __syncthreads();
    float* part = ks;  // [HG, ld]
#pragma unroll
    for (int h = 0; h < HG; ++h)
#pragma unroll
        for (int j = 0; j < CPT; ++j) part[h * ld + tid + j * kThreads] = acc[h][j];
    if (warp < HG && lane == 0) ml[warp] = m_run, ml[HG + warp] = l_run;
    float* orow = p.out + (static_cast<int64_t>(row) * p.heads + h0) * d;
    merge_cluster_outputs<HG, kThreads>(orow, part, ld, ml, wts, p.sinks + h0, nh, d, splits, rank);
}

struct IndexerParams {
    float* scores;           // [T, E] f32
    const float* q;          // [T, Hi, c] f32
    const float* keys;       // [E, c] f32
    const float* weights;    // [T, Hi] f32
    int rows, heads, c, entries;
    int ld;                  // floats per staged row: c rounded up to 4
    int head_blocks;         // ceil(Hi / 8)
    int rows_per_block;
    int vec;                 // c % 4 == 0 and q, keys 16-byte aligned
    float scale;
    // Rows of several sequences (one row per block): row t's keys are keys[key_begin[t] ..][0 .. key_count[t])
    // and entries is the row stride of scores. Null: every row scores all `entries` keys.
    const int32_t* key_begin;
    const int32_t* key_count;
};

constexpr int indexer_smem_floats(int ne, int head_blocks, int ld) {
    return 4 * ne * ld + head_blocks * 8 * (ld + 1) + kWarps * 4 * ne;
}

// Grid: (ceil(E / (4 NE)), ceil(T / rows_per_block)). Lane = 8 * g + s: s splits c (float4s s, s + 8, ..),
// g takes entries g + 4 j (j < NE); warp w takes head blocks w, w + 8, .. of 8 heads.
template <int NE>
__global__ void __launch_bounds__(kThreads, 2) indexer_scores_kernel(IndexerParams p) {
    constexpr int kTile = 4 * NE;
    extern __shared__ float4 smem4[];
    const int ld = p.ld, hp = p.head_blocks * 8;
    float* ks = reinterpret_cast<float*>(smem4);  // [kTile, ld] the block's keys
    float* qs = ks + kTile * ld;                  // [hp, ld] one query row, zero rows beyond Hi
    float* ws = qs + hp * ld;                     // [hp] its head weights, zero beyond Hi
    float* red = ws + hp;                         // [kWarps, kTile] per-warp sums over its heads
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, s = lane % 8, g = lane / 8;
    const int t0 = blockIdx.y * p.rows_per_block, t1 = min(p.rows, t0 + p.rows_per_block);
    const int64_t key0 = p.key_begin ? p.key_begin[t0] : 0;
    const int count = p.key_count ? p.key_count[t0] : p.entries;  // the row's keys
    const int e0 = blockIdx.x * kTile;
    if (e0 >= count) return;  // (ragged rows) past this row's keys: the whole block
    const int ne = min(kTile, count - e0);
    // The block's keys; waited for with the first row's queries.
    stage_rows(ks, kTile, ld, p.c, p.vec,
               [&](int e) { return e < ne ? p.keys + (key0 + e0 + e) * p.c : nullptr; });
    const int nch = (p.c + 3) / 4;
    for (int t = t0; t < t1; ++t) {
        __syncthreads();  // the previous row's qs and red are consumed
        const float* qrow = p.q + static_cast<int64_t>(t) * p.heads * p.c;
        stage_rows(qs, hp, ld, p.c, p.vec,
                   [&](int h) { return h < p.heads ? qrow + static_cast<int64_t>(h) * p.c : nullptr; });
        for (int h = tid; h < hp; h += kThreads)
            ws[h] = h < p.heads ? p.weights[static_cast<int64_t>(t) * p.heads + h] : 0.0f;
        cp_async_wait_all();
        __syncthreads();

        float tot[NE] = {};
        for (int hb = warp; hb < p.head_blocks; hb += kWarps) {
            float dot[8 * NE] = {};  // [head, entry]
            const float4* q4 = reinterpret_cast<const float4*>(qs + hb * 8 * ld);
            const float4* k4 = reinterpret_cast<const float4*>(ks + g * ld);
#pragma unroll 1
            for (int ch = s; ch < nch; ch += 8) {
                float4 qv[8];
#pragma unroll
                for (int h = 0; h < 8; ++h) qv[h] = q4[h * ld / 4 + ch];
#pragma unroll
                for (int j = 0; j < NE; ++j) {
                    const float4 kv = k4[4 * j * ld / 4 + ch];
#pragma unroll
                    for (int h = 0; h < 8; ++h) dot[h * NE + j] = dot4(qv[h], kv, dot[h * NE + j]);
                }
            }
            transpose_sum<8 * NE, 4>(dot, lane);  // now dot[j]: head 8 hb + s, entry g + 4 j
            const float w = ws[hb * 8 + s];
#pragma unroll
            for (int j = 0; j < NE; ++j) tot[j] = fmaf(w, fmaxf(dot[j], 0.0f), tot[j]);
        }
#pragma unroll
        for (int j = 0; j < NE; ++j) {
            for (int m = 4; m > 0; m >>= 1) tot[j] += __shfl_xor_sync(0xffffffffu, tot[j], m);
            if (s == 0) red[warp * kTile + g + 4 * j] = tot[j];
        }
        __syncthreads();
        if (tid < ne) {
            float sum = 0.0f;
            for (int w = 0; w < kWarps; ++w) sum += red[w * kTile + tid];
            p.scores[static_cast<int64_t>(t) * p.entries + e0 + tid] = sum * p.scale;
        }
    }
}

// Raises a kernel's dynamic shared memory limit once per device (bit per device).
template <int HG, int CPT>
void launch_attention(const AttnParams& p, int64_t rows, cudaStream_t stream) {
    auto kernel = sparse_attention_kernel<HG, CPT>;
    static std::atomic<uint64_t> configured{0};
    const int smem = attn_smem_floats(HG, p.ld) * 4;
    allow_smem(kernel, attn_smem_floats(HG, CPT * kThreads) * 4, configured);
    launch_clustered(kernel, dim3(static_cast<unsigned>(rows * p.splits), static_cast<unsigned>(ceil_div(p.heads, HG))),
                     p.splits, kThreads, smem, stream, p);
}

template <int HG>
void launch_attention_cols(const AttnParams& p, int64_t rows, int cpt, cudaStream_t stream) {
    if (cpt == 1) launch_attention<HG, 1>(p, rows, stream);
    else if (cpt == 2) launch_attention<HG, 2>(p, rows, stream);
    else launch_attention<HG, 4>(p, rows, stream);
}

template <int NE>
void launch_indexer(const IndexerParams& p, cudaStream_t stream) {
    auto kernel = indexer_scores_kernel<NE>;
    static std::atomic<uint64_t> configured{0};
    const int smem = indexer_smem_floats(NE, p.head_blocks, p.ld) * 4;
    allow_smem(kernel, 227 * 1024, configured);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.entries, 4 * NE)),
                    static_cast<unsigned>(ceil_div(p.rows, p.rows_per_block)));
    kernel<<<grid, kThreads, smem, stream>>>(p);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_sparse_attention(float* out, const float* q, const float* keys, const int32_t* offsets,
                             const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, int64_t d,
                             float scale, bool batch_invariant, cudaStream_t stream) {
    DI_ICHECK(d <= kMaxHeadDim, "head_dim ", d, " is too large for the CUDA attention kernel");
    if (rows * heads * d == 0) return;
    const int64_t sms = device_sm_count(), target = 2 * sms;
    // Eight heads share each staged key (half the key traffic of four) unless even the largest split leaves
    // SMs idle (decode of one row): then four, which doubles the blocks.
    const int hg = heads > 4 && rows * ceil_div(heads, 8) * kMaxSplits >= sms ? 8 : 4;
    const int64_t groups = ceil_div(heads, hg);
    int splits = 1;
    while (!batch_invariant && splits < kMaxSplits && rows * groups * splits * 2 <= target) splits *= 2;
    const int cpt = d <= kThreads ? 1 : d <= 2 * kThreads ? 2 : 4;
    const bool vec = d % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(keys) % 16 == 0;
    const AttnParams p{out,
                       q,
                       keys,
                       offsets,
                       indices,
                       sinks,
                       static_cast<int>(heads),
                       static_cast<int>(d),
                       cpt * kThreads,
                       splits,
                       vec,
                       scale};
    if (hg == 8) launch_attention_cols<8>(p, rows, cpt, stream);
    else launch_attention_cols<4>(p, rows, cpt, stream);
}

void launch_indexer_scores(float* scores, const float* q, const float* keys, const float* weights, int64_t rows,
                           int64_t heads, int64_t c, int64_t entries, float scale, cudaStream_t stream,
                           const int32_t* key_begin, const int32_t* key_count) {
    if (rows * entries == 0) return;
    const int64_t sms = device_sm_count();
    const int ld = static_cast<int>(ceil_div(c, 4) * 4), head_blocks = static_cast<int>(ceil_div(heads, 8));
    // Tiles of 24 entries (each staged query float4 serves 6 of them per lane; 8 would need more than the 128
    // registers of 2 blocks per SM) once the (row, tile) pairs fill the SMs; else tiles of 8, so that a single
    // decode row still spreads over the GPU.
    const int ne = ceil_div(entries, 24) * rows >= sms ? 6 : 2;
    const int64_t pairs = ceil_div(entries, 4 * ne) * rows;
    // Several rows per block once there are 8 pairs per SM: the key tile is staged once for all of them.
    const int rows_per_block = key_begin ? 1 : static_cast<int>(std::clamp<int64_t>(pairs / (8 * sms), 1, 16));
    DI_ICHECK(indexer_smem_floats(ne, head_blocks, ld) * 4 <= 227 * 1024, "indexer shape ", heads, " x ", c,
              " does not fit in shared memory");
    const bool vec = c % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(keys) % 16 == 0;
    const IndexerParams p{scores, q, keys, weights, static_cast<int>(rows), static_cast<int>(heads),
                          static_cast<int>(c), static_cast<int>(entries), ld, head_blocks, rows_per_block,
                          vec, scale, key_begin, key_count};
    if (ne == 6) launch_indexer<6>(p, stream);
    else launch_indexer<2>(p, stream);
}

}  // namespace deepinfer::cuda
