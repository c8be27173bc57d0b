// Counter-based random numbers: a value is a pure function of (seed, index), with no state.
//
// Initialisation, dropout masks and data shuffling all draw from here, so a number never
// depends on which rank, thread or device computes it, nor on the order things are computed
// in: what makes runs bitwise-reproducible and layouts comparable.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace trident::kernels {

// The uniform draws are also compiled for CUDA kernels (kernels/cuda/), so the GPU backend
// draws dropout masks bit for bit as the CPU does (kernels/host_device.h).

// splitmix64's finaliser over seed and index: well mixed 64 bits.
TRIDENT_HOST_DEVICE inline uint64_t hash64(uint64_t seed, uint64_t index) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits, exact in float.
TRIDENT_HOST_DEVICE inline float uniform_float(uint64_t seed, uint64_t index) {
    return static_cast<float>(hash64(seed, index) >> 40) * (1.0f / 16777216.0f);
}

// Uniform in (0, 1) with 53 random bits.
TRIDENT_HOST_DEVICE inline double uniform_open(uint64_t seed, uint64_t index) {
    return (static_cast<double>(hash64(seed, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller on two independent uniforms.
inline double normal(uint64_t seed, uint64_t index) {
    const double u1 = uniform_open(seed, 2 * index);
    const double u2 = uniform_open(seed, 2 * index + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace trident::kernels
