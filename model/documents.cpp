// The documents of a microbatch's windows (see documents.h).
#include "model/documents.h"

#include <cstddef>

namespace trident::model {

std::vector<int32_t> document_starts(const int32_t* tokens, int B, int T, int eod) {
    std::vector<int32_t> starts(static_cast<std::size_t>(B) * static_cast<std::size_t>(T));
    for (int b = 0; b < B; ++b) {
        const std::size_t row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
        int32_t start = 0;
        for (int t = 0; t < T; ++t) {
            starts[row + static_cast<std::size_t>(t)] = start;
            if (tokens[row + static_cast<std::size_t>(t)] == eod) start = t + 1;
        }
    }
    return starts;
}

std::vector<int32_t> eod_rows(const int32_t* tokens, int B, int T, int eod) {
    std::vector<int32_t> rows;
    for (int n = 0; n < B * T; ++n)
        if (tokens[n] == eod) rows.push_back(n);
    return rows;
}

int counted_positions(const int32_t* tokens, int T, const DocumentOptions& o) {
    if (!o.mask_eod_loss) return T;
    return T - static_cast<int>(eod_rows(tokens, 1, T, o.eod).size());
}

const int32_t* document_positions(const Pass& pass) {
    return pass.documents ? pass.documents->positions() : nullptr;
}

const int32_t* document_starts(const Pass& pass) {
    return pass.documents ? pass.documents->starts() : nullptr;
}

void Documents::find(kernels::Ops& ops, const DocumentOptions& o, const int32_t* tokens, int B,
                     int T) {
    mask_ = o.mask;
    N_ = B * T;
    uncounted_ = o.mask_eod_loss ? eod_rows(tokens, B, T, o.eod) : std::vector<int32_t>();
    if (!mask_) return;
    const std::size_t N = static_cast<std::size_t>(N_);
    std::vector<int32_t> host = document_starts(tokens, B, T, o.eod);
    host.resize(2 * N);
    for (std::size_t n = 0; n < N; ++n)
        host[N + n] = static_cast<int32_t>(n % static_cast<std::size_t>(T)) - host[n];
    if (device_.size() != 2 * N) device_ = kernels::DeviceBuffer(ops, 2 * N, kernels::DType::i32);
    ops.upload(device_.data().data, host.data(), host.size() * sizeof(int32_t));
}

const int32_t* Documents::device_ptr(int which) const {
    return static_cast<const int32_t*>(device_.data().data) +
           static_cast<std::size_t>(which) * static_cast<std::size_t>(N_);
}

}  // namespace trident::model
