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

const int32_t* document_starts_held(const Pass& pass) {
    return pass.documents ? pass.documents->held_starts() : nullptr;
}

std::size_t Documents::elements(int B, int S, int T) {
    return static_cast<std::size_t>(B) *
           (static_cast<std::size_t>(S) + 2 * static_cast<std::size_t>(T));
}

void Documents::find(kernels::Ops& ops, const DocumentOptions& o, const int32_t* tokens, int B,
                     int T, int32_t* device) {
    std::vector<int32_t> held(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) held[static_cast<std::size_t>(t)] = t;
    find_split(ops, o, tokens, tokens, B, T, held, device);
}

void Documents::find_split(kernels::Ops& ops, const DocumentOptions& o, const int32_t* whole,
                           const int32_t* local, int B, int S, std::span<const int32_t> held,
                           int32_t* device) {
    const int T = static_cast<int>(held.size());
    mask_ = o.mask;
    uncounted_ = o.mask_eod_loss ? eod_rows(local, B, T, o.eod) : std::vector<int32_t>();
    if (!mask_) return;
    starts_ = static_cast<std::size_t>(B) * static_cast<std::size_t>(S);
    held_ = static_cast<std::size_t>(B) * held.size();
    std::vector<int32_t> host = document_starts(whole, B, S, o.eod);
    host.resize(starts_ + 2 * held_);
    for (std::size_t b = 0; b < static_cast<std::size_t>(B); ++b)
        for (std::size_t t = 0; t < held.size(); ++t) {
            const int32_t at = held[t];
            const int32_t start =
                host[b * static_cast<std::size_t>(S) + static_cast<std::size_t>(at)];
            host[starts_ + b * held.size() + t] = at - start;
            host[starts_ + held_ + b * held.size() + t] = start;
        }
    device_ = device;
    ops.upload(device, host.data(), host.size() * sizeof(int32_t));
}

}  // namespace trident::model
