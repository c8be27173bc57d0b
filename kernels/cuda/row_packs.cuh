// A row of a (N, channels) tensor as one warp reads it in 16-byte packs (elements.cuh), for the row
// kernels (LayerNorm's forward and backward).
//
// Lane l takes packs l, l + 32, l + 64, ... of the row: pack p is elements p·P .. p·P + P - 1,
// P = kPack<E>, so each load instruction of the warp reads 32 consecutive packs (512 bytes).
// A lane's k-th pack is the same columns whatever the row, which is what lets a warp keep
// per-column sums (the parameter gradients) across rows.
//
// Two ways to move a pack, one result: whole 16-byte loads where the row allows them (channels a
// multiple of P and the buffer 16-byte aligned: `vector`), else element by element with the
// elements past channels reading as zero and never written. The arithmetic is the same either way,
// so a kernel gives the same bits on an aligned and an unaligned buffer.
#pragma once

#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

// How many packs each lane takes of rows of channels elements of E (ceil over the 32 lanes).
template <typename E>
__host__ __device__ inline int packs_per_lane(int channels) {
    const int packs = (channels + kPack<E> - 1) / kPack<E>;
    return (packs + 31) / 32;
}

// The first element of a lane's k-th pack.
template <typename E>
__device__ __forceinline__ int pack_column(int lane, int k) {
    return (lane + 32 * k) * kPack<E>;
}

// The pack of row x (channels elements) from column c; elements past channels are zero.
template <typename E>
__device__ __forceinline__ Pack<E> row_pack(const E* x, int c, int channels, bool vector) {
    Pack<E> v;
    if (vector && c < channels) return load_pack(x + c);
#pragma unroll
    for (int e = 0; e < kPack<E>; ++e) v.v[e] = c + e < channels ? x[c + e] : from_float<E>(0.0f);
    return v;
}

// Writes a pack into row y from column c, elements below channels only.
template <typename E>
__device__ __forceinline__ void store_row_pack(E* y, int c, const Pack<E>& v, int channels,
                                               bool vector) {
    if (vector) {
        if (c < channels) store_pack(y + c, v);
        return;
    }
#pragma unroll
    for (int e = 0; e < kPack<E>; ++e)
        if (c + e < channels) y[c + e] = v.v[e];
}

}  // namespace trident::kernels::cuda
