// Flash attention on the tensor cores for bf16 and fp16 (flash_geometry.cuh has the geometry):
// the kernels that run where cuDNN's fused attention cannot (attention dropout, whose mask is
// the model's; shapes or releases it refuses), so that such a run costs about what cuDNN's
// would rather than the fp32 kernels' ten times as much.
//
// The arithmetic is that of attention_kernels.cuh (the online softmax forward; a backward that
// recomputes p = exp(score - lse) tile by tile, dk and dv by one kernel over blocks of keys and
// dq by another over blocks of queries, no atomics, so runs repeat bit for bit), but the
// products run as warp-level mma.sync m16n8k16 (sm_80 and later) on 16-bit inputs with fp32
// accumulation. Each block has 4 warps; each warp owns 16 rows of the block's 64 (queries in
// the forward and dq, keys in dk, dv). Tiles of 64 (or 32) rows of q, k, v or dout move
// through shared memory, rows padded by 16 bytes so that ldmatrix's eight row reads fall in
// different banks. As cuDNN's kernels do, the probabilities and dS are rounded to the 16-bit
// type before their products (the row sums and the softmax statistics stay fp32).
//
// Fragments (PTX ISA, mma.m16n8k16 with .bf16/.f16): lane = 4g + t holds, of a 16x8 fp32
// accumulator, rows g and g + 8 at columns 2t and 2t + 1 (c[0], c[1] on row g; c[2], c[3] on
// row g + 8). Two adjacent accumulator tiles (16 columns) are, packed in pairs, exactly the A
// fragment of the next product over those 16 columns, so probabilities never leave registers.
// Head dims are padded with zeros to D = 16, 32, 64 or 128 (the zeros add nothing).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_geometry.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockRows = 16 * kWarps;  // rows a block owns: queries, or keys in dk/dv
constexpr int kPad = 8;                  // elements after each shared-memory row
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The tile of rows that streams past a block's rows: 64, or 32 for heads of 128 (whose
// accumulators would not fit in registers beside two 64-column ones).
template <int D>
inline constexpr int kStreamRows = D <= 64 ? 64 : 32;

// ---- the tensor-core instructions ---------------------------------------------------------

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements: lanes 8m .. 8m + 7 give the addresses of matrix m's
// rows; r[m] is this lane's pair of matrix m (row lane / 4, columns 2 (lane % 4) + 0, 1), or
// with .trans of its transpose.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
}

// c (16x8, fp32) += a (16x16) b (16x8).
template <typename E>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two floats rounded to E, the first in the low half (the lower column of a fragment pair).
template <typename E>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    } else {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
}

// ---- tiles in shared memory ---------------------------------------------------------------

// tile (Rows, D + kPad) = rows row0 .. row0 + Rows - 1 of a head's matrix, row r at element
// base + r * stride of src, dims below hs; rows at or past `rows` and the other dims are zero.
// `vector`: hs, the row stride and src allow 16-byte loads of whole chunks of 8 dims.
template <typename E, int Rows, int D>
__device__ void load_tile(E* tile, const E* src, std::size_t base, std::size_t stride, int row0,
                          int rows, int hs, bool vector) {
    constexpr int chunks = D / 8;
    for (int i = threadIdx.x; i < Rows * chunks; i += kThreads) {
        const int r = i / chunks, d0 = i % chunks * 8, row = row0 + r;
        const E* from = src + base + static_cast<std::size_t>(row) * stride + d0;
        Pack<E> v;
        if (row < rows && vector && d0 + 8 <= hs) {
            v = load_pack(from);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                v.v[e] = row < rows && d0 + e < hs ? from[e] : from_float<E>(0.0f);
        }
        store_pack(tile + r * (D + kPad) + d0, v);
    }
}

// acc (16 x 8 NT) += A B^T: A the 16 rows of `a` from row a0 (this warp's), B the 8 NT rows of
// `b` (both D wide, in shared memory): acc[n] column c is row 8n + c of b.
template <typename E, int D, int NT>
__device__ void multiply_rows(float (&acc)[NT][4], const E* a, int a0, const E* b, int lane) {
    constexpr int S = D + kPad;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[4];
        load_matrices(af, a + (a0 + lane % 16) * S + kk * 16 + lane / 16 * 8);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t bf[4];
            load_matrices(
                bf, b + (np * 16 + lane / 16 * 8 + lane % 8) * S + kk * 16 + lane / 8 % 2 * 8);
            mma<E>(acc[2 * np], af, bf[0], bf[1]);
            mma<E>(acc[2 * np + 1], af, bf[2], bf[3]);
        }
    }
}

// acc (16 x D) += P M: P (16 x 8 NT) in accumulator fragments, rounded to E; M the 8 NT rows
// of `m` (D wide, in shared memory).
template <typename E, int D, int NT>
__device__ void multiply_probs(float (&acc)[D / 8][4], const float (&p)[NT][4], const E* m,
                               int lane) {
    constexpr int S = D + kPad;
#pragma unroll
    for (int kp = 0; kp < NT / 2; ++kp) {
        const uint32_t af[4] = {pack_pair<E>(p[2 * kp][0], p[2 * kp][1]),
                                pack_pair<E>(p[2 * kp][2], p[2 * kp][3]),
                                pack_pair<E>(p[2 * kp + 1][0], p[2 * kp + 1][1]),
                                pack_pair<E>(p[2 * kp + 1][2], p[2 * kp + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t bf[4];
            load_matrices_transposed(
                bf, m + (kp * 16 + lane / 8 % 2 * 8 + lane % 8) * S + dp * 16 + lane / 16 * 8);
            mma<E>(acc[2 * dp], af, bf[0], bf[1]);
            mma<E>(acc[2 * dp + 1], af, bf[2], bf[3]);
        }
    }
}

// The column of accumulator element c of tile n for this lane, and its row (0 .. 15).
__device__ __forceinline__ int fragment_column(int n, int c, int lane) {
    return n * 8 + lane % 4 * 2 + (c & 1);
}
__device__ __forceinline__ int fragment_row(int c, int lane) {
    return lane / 4 + (c >= 2 ? 8 : 0);
}

// dst[base + row * stride + d] = scale * acc (+ what it held, with Add) over this warp's 16
// rows from row0 (rows below `rows`, dims below hs), in E.
template <bool Add, typename E, int D>
__device__ void write_rows(E* dst, std::size_t base, std::size_t stride, int row0, int rows, int hs,
                           const float (&acc)[D / 8][4], float scale, int lane) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int row = row0 + fragment_row(c, lane), d = fragment_column(n, c, lane);
            if (row >= rows || d >= hs) continue;
            E& x = dst[base + static_cast<std::size_t>(row) * stride + d];
            x = from_float<E>((Add ? to_float(x) : 0.0f) + scale * acc[n][c]);
        }
}

// Shared memory of each kernel, and the opt-in a block past 48 KiB needs.
template <typename E, int D>
constexpr std::size_t tile_bytes(int rows) {
    return static_cast<std::size_t>(rows) * (D + kPad) * sizeof(E);
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
    if (bytes > 48 * 1024)
        TRIDENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(bytes)));
}

// ---- forward ---------------------------------------------------------------------------------

// The rows this lane's accumulators hold: a warp's rows g and g + 8 (g = lane / 4).
struct LaneRows {
    int row[2];
    __device__ LaneRows(int first, int lane) : row{first + lane / 4, first + lane / 4 + 8} {}
};

// The online softmax over one tile of scores s (this warp's 16 rows by NT * 8 keys from j0 of
// batch b; the products on entry, the probabilities on exit, 0 where a key is not seen): each
// row's max m and sum l (log2 units) move to the tile, and its outputs so far are rescaled to
// the new max. A row that has seen no key yet (its document starts past the tile) keeps m -inf.
template <int D, int NT>
__device__ void softmax_tile(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                             const LaneRows& mine, int j0, const FlashGeometry& g, int b,
                             float scale, int lane) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int j = j0 + fragment_column(n, c, lane), i = mine.row[c / 2];
            s[n][c] = j <= i && j < g.T && g.in_document(b, i, j) ? s[n][c] * scale : -INFINITY;
            tile_max[c / 2] = fmaxf(tile_max[c / 2], s[n][c]);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float m_new = fmaxf(m[r], tile_max[r]);
        // 0 on the first tile a row sees (m = -inf); 1 while it has seen none.
        const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
        l[r] *= alpha;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][2 * r] *= alpha;
            o[n][2 * r + 1] *= alpha;
        }
        m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            s[n][c] = s[n][c] == -INFINITY ? 0.0f : exp2f(s[n][c] - m[c / 2]);  // 0: not seen
            l[c / 2] += s[n][c];
        }
}

// One block per (64 queries, head, batch), the last query blocks (the most keys) first. Keys
// and values stream through shared memory 64 rows at a time, as far as the block's last query
// sees; each row keeps a running max m and sum l (log2 units) and its unnormalised output.
// values false: lse alone (the keys' products and the softmax sums are the same instructions
// either way, so lse is bit for bit a full forward's).
template <typename E, int D>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(E* out, float* lse, const E* qkv, FlashGeometry g, bool values,
                       bool vector) {
    constexpr int S = D + kPad, NT = kBlockRows / 8;
    extern __shared__ __align__(16) unsigned char shared[];
    E* queries = reinterpret_cast<E*>(shared);
    E* keys = queries + kBlockRows * S;
    E* vals = keys + kBlockRows * S;
    const int b = blockIdx.z, h = blockIdx.y;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.channels), q_base = g.q_base(b, h);
    const float scale = g.scale * kLog2e;
    load_tile<E, kBlockRows, D>(queries, qkv, q_base, stride, i0, g.T, g.hs, vector);
    const LaneRows mine(i0 + warp * 16, lane);
    float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int j0 = g.first_key(b, i0) / kBlockRows * kBlockRows; j0 < min(g.T, i0 + kBlockRows);
         j0 += kBlockRows) {
        __syncthreads();  // the previous tiles are used up
        load_tile<E, kBlockRows, D>(keys, qkv, q_base + g.channels, stride, j0, g.T, g.hs, vector);
        if (values)
            load_tile<E, kBlockRows, D>(vals, qkv, q_base + 2 * g.channels, stride, j0, g.T, g.hs,
                                        vector);
        __syncthreads();
        float s[NT][4] = {};
        multiply_rows<E, D, NT>(s, queries, warp * 16, keys, lane);
        softmax_tile<D, NT>(s, m, l, o, mine, j0, g, b, scale, lane);
        if (values && g.drop_prob > 0.0f) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int j = j0 + fragment_column(n, c, lane), i = mine.row[c / 2];
                    if (s[n][c] > 0.0f) s[n][c] *= g.dropout_factor(g.mask_row(b, h, i) + j);
                }
        }
        if (values) multiply_probs<E, D, NT>(o, s, vals, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int i = mine.row[r];
        if (lane % 4 == 0 && i < g.T) lse[g.stat(b, h, i)] = (m[r] + log2f(l[r])) * kLn2;
    }
    if (!values) return;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[n][c] /= l[c / 2];
    write_rows<false, E, D>(out, g.out_base(b, h), g.channels, i0 + warp * 16, g.T, g.hs, o, 1.0f,
                            lane);
}

// ---- backward --------------------------------------------------------------------------------

// p = exp(score - lse) of a visible (query i, key j), times the dropout factor z into pz; ds =
// p (z dP - row dot) (dS without the scale). Scores in log2 units.
struct Probability {
    float pz, ds;
};
__device__ __forceinline__ Probability probability(const FlashGeometry& g, int b, int h, int i,
                                                   int j, float score, float lse2, float dp,
                                                   float row_dot) {
    if (!g.visible(b, i, j)) return {0.0f, 0.0f};
    const float p = exp2f(score - lse2);
    const float z = g.dropout_factor(g.mask_row(b, h, i) + j);
    return {p * z, p * (dp * z - row_dot)};
}

// dk, dv of a block of 64 keys: the query tiles from the first that sees one of them stream
// through shared memory. S^T = K Q^T and dP^T = V dO^T per warp (its 16 keys against the
// tile's queries), then dV += (P Z)^T dO and dK += dS^T Q.
template <typename E, int D>
__global__ void __launch_bounds__(kThreads)
    mma_dkv_kernel(E* dqkv, const float* row_dot, const E* dout, const E* qkv, const float* lse,
                   FlashGeometry g, bool vector) {
    constexpr int S = D + kPad, QT = kStreamRows<D>, NT = QT / 8;
    extern __shared__ __align__(16) unsigned char shared[];
    E* keys = reinterpret_cast<E*>(shared);
    E* vals = keys + kBlockRows * S;
    E* queries = vals + kBlockRows * S;
    E* grads = queries + QT * S;
    float* tile_lse = reinterpret_cast<float*>(grads + QT * S);
    float* tile_dot = tile_lse + QT;
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kBlockRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.channels), q_base = g.q_base(b, h);
    const float scale = g.scale * kLog2e;
    load_tile<E, kBlockRows, D>(keys, qkv, q_base + g.channels, stride, j0, g.T, g.hs, vector);
    load_tile<E, kBlockRows, D>(vals, qkv, q_base + 2 * g.channels, stride, j0, g.T, g.hs, vector);
    const LaneRows mine(j0 + warp * 16, lane);
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    for (int i0 = j0 / QT * QT; i0 < g.T; i0 += QT) {
        if (g.sees_none_from(b, i0, j0 + kBlockRows - 1)) break;
        __syncthreads();  // the previous tiles are used up
        load_tile<E, QT, D>(queries, qkv, q_base, stride, i0, g.T, g.hs, vector);
        load_tile<E, QT, D>(grads, dout, g.out_base(b, h), g.channels, i0, g.T, g.hs, vector);
        for (int r = threadIdx.x; r < QT; r += kThreads) {
            const bool real = i0 + r < g.T;
            tile_lse[r] = real ? lse[g.stat(b, h, i0 + r)] * kLog2e : 0.0f;
            tile_dot[r] = real ? row_dot[g.stat(b, h, i0 + r)] : 0.0f;
        }
        __syncthreads();
        float st[NT][4] = {}, dpt[NT][4] = {};
        multiply_rows<E, D, NT>(st, keys, warp * 16, queries, lane);
        multiply_rows<E, D, NT>(dpt, vals, warp * 16, grads, lane);
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int q = fragment_column(n, c, lane);
                const Probability p =
                    probability(g, b, h, i0 + q, mine.row[c / 2], st[n][c] * scale, tile_lse[q],
                                dpt[n][c], tile_dot[q]);
                st[n][c] = p.pz;
                dpt[n][c] = p.ds;
            }
        multiply_probs<E, D, NT>(dv, st, grads, lane);
        multiply_probs<E, D, NT>(dk, dpt, queries, lane);
    }
    write_rows<true, E, D>(dqkv, q_base + g.channels, stride, j0 + warp * 16, g.T, g.hs, dk,
                           g.scale, lane);
    write_rows<true, E, D>(dqkv, q_base + 2 * g.channels, stride, j0 + warp * 16, g.T, g.hs, dv,
                           1.0f, lane);
}

// dq of a block of 64 queries, the last blocks (the most keys) first: the key tiles they see
// stream through shared memory. S = Q K^T and dP = dO V^T per warp, then dQ += dS K.
template <typename E, int D>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(E* dqkv, const float* row_dot, const E* dout, const E* qkv, const float* lse,
                  FlashGeometry g, bool vector) {
    constexpr int S = D + kPad, KT = kStreamRows<D>, NT = KT / 8;
    extern __shared__ __align__(16) unsigned char shared[];
    E* queries = reinterpret_cast<E*>(shared);
    E* grads = queries + kBlockRows * S;
    E* keys = grads + kBlockRows * S;
    E* vals = keys + KT * S;
    const int b = blockIdx.z, h = blockIdx.y;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.channels), q_base = g.q_base(b, h);
    const float scale = g.scale * kLog2e;
    load_tile<E, kBlockRows, D>(queries, qkv, q_base, stride, i0, g.T, g.hs, vector);
    load_tile<E, kBlockRows, D>(grads, dout, g.out_base(b, h), g.channels, i0, g.T, g.hs, vector);
    const LaneRows mine(i0 + warp * 16, lane);
    float lse2[2], dot[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const bool real = mine.row[r] < g.T;
        lse2[r] = real ? lse[g.stat(b, h, mine.row[r])] * kLog2e : 0.0f;
        dot[r] = real ? row_dot[g.stat(b, h, mine.row[r])] : 0.0f;
    }
    float dq[D / 8][4] = {};
    for (int j0 = g.first_key(b, i0) / KT * KT; j0 < min(g.T, i0 + kBlockRows); j0 += KT) {
        __syncthreads();
        load_tile<E, KT, D>(keys, qkv, q_base + g.channels, stride, j0, g.T, g.hs, vector);
        load_tile<E, KT, D>(vals, qkv, q_base + 2 * g.channels, stride, j0, g.T, g.hs, vector);
        __syncthreads();
        float s[NT][4] = {}, dp[NT][4] = {};
        multiply_rows<E, D, NT>(s, queries, warp * 16, keys, lane);
        multiply_rows<E, D, NT>(dp, grads, warp * 16, vals, lane);
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = c / 2;
                s[n][c] = probability(g, b, h, mine.row[r], j0 + fragment_column(n, c, lane),
                                      s[n][c] * scale, lse2[r], dp[n][c], dot[r])
                              .ds;
            }
        multiply_probs<E, D, NT>(dq, s, keys, lane);
    }
    write_rows<true, E, D>(dqkv, q_base, stride, i0 + warp * 16, g.T, g.hs, dq, g.scale, lane);
}

// Calls f(std::integral_constant<int, D>{}) with the padded head size of hs (<= 128).
template <typename F>
void with_head_dims(int hs, F&& f) {
    if (hs <= 16)
        f(std::integral_constant<int, 16>{});
    else if (hs <= 32)
        f(std::integral_constant<int, 32>{});
    else if (hs <= 64)
        f(std::integral_constant<int, 64>{});
    else
        f(std::integral_constant<int, 128>{});
}

// Whole 16-byte chunks of 8 dims: every row of q, k, v, out and dout starts 16-byte aligned.
bool vector_rows(const FlashGeometry& g, std::initializer_list<const void*> pointers) {
    if (g.hs % 8 != 0 || g.channels % 8 != 0) return false;
    for (const void* p : pointers)
        if (p != nullptr && !pack_aligned(p)) return false;
    return true;
}

dim3 grid_of(const FlashGeometry& g) {
    return dim3(static_cast<unsigned>((g.T + kBlockRows - 1) / kBlockRows),
                static_cast<unsigned>(g.NH), static_cast<unsigned>(g.B));
}

}  // namespace

template <typename E>
void tensor_core_attention_forward(E* out, float* lse, const E* qkv, const FlashGeometry& g,
                                   cudaStream_t stream) {
    const bool vector = vector_rows(g, {out, qkv});
    with_head_dims(g.hs, [&](auto dims) {
        constexpr int D = decltype(dims)::value;
        const std::size_t bytes = 3 * tile_bytes<E, D>(kBlockRows);
        allow_shared(mma_forward_kernel<E, D>, bytes);
        mma_forward_kernel<E, D>
            <<<grid_of(g), kThreads, bytes, stream>>>(out, lse, qkv, g, out != nullptr, vector);
        TRIDENT_CUDA_CHECK_LAUNCH();
    });
}

template <typename E>
void tensor_core_attention_backward(E* dqkv, const float* row_dot, const E* dout, const E* qkv,
                                    const float* lse, const FlashGeometry& g, cudaStream_t stream) {
    const bool vector = vector_rows(g, {dqkv, dout, qkv});
    with_head_dims(g.hs, [&](auto dims) {
        constexpr int D = decltype(dims)::value;
        constexpr int rows = kStreamRows<D>;
        const std::size_t dkv_bytes = 2 * tile_bytes<E, D>(kBlockRows) +
                                      2 * tile_bytes<E, D>(rows) + 2 * rows * sizeof(float);
        allow_shared(mma_dkv_kernel<E, D>, dkv_bytes);
        mma_dkv_kernel<E, D>
            <<<grid_of(g), kThreads, dkv_bytes, stream>>>(dqkv, row_dot, dout, qkv, lse, g, vector);
        TRIDENT_CUDA_CHECK_LAUNCH();
        const std::size_t dq_bytes = 2 * tile_bytes<E, D>(kBlockRows) + 2 * tile_bytes<E, D>(rows);
        allow_shared(mma_dq_kernel<E, D>, dq_bytes);
        mma_dq_kernel<E, D>
            <<<grid_of(g), kThreads, dq_bytes, stream>>>(dqkv, row_dot, dout, qkv, lse, g, vector);
        TRIDENT_CUDA_CHECK_LAUNCH();
    });
}

template void tensor_core_attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*,
                                                           const __nv_bfloat16*,
                                                           const FlashGeometry&, cudaStream_t);
template void tensor_core_attention_forward<__half>(__half*, float*, const __half*,
                                                    const FlashGeometry&, cudaStream_t);
template void tensor_core_attention_backward<__nv_bfloat16>(__nv_bfloat16*, const float*,
                                                            const __nv_bfloat16*,
                                                            const __nv_bfloat16*, const float*,
                                                            const FlashGeometry&, cudaStream_t);
template void tensor_core_attention_backward<__half>(__half*, const float*, const __half*,
                                                     const __half*, const float*,
                                                     const FlashGeometry&, cudaStream_t);

}  // namespace trident::kernels::cuda
