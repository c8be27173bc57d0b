// Expert parallelism's exchange of one MoE layer's rows (see moe_dispatch.h).
#include "model/moe_dispatch.h"

namespace trident::model {

namespace {

// out (count, width) = table's rows index[0 ..] (count of them, on the device): a row
// gather, the embedding's lookup in a table of `table_rows` rows.
void gather(const ExchangeBuffers& b, kernels::Ptr out, kernels::ConstPtr table, int table_rows,
            const std::vector<int32_t>& index, int width) {
    if (index.empty()) return;
    b.ops.upload(b.index, index.data(), index.size() * sizeof(int32_t));
    b.ops.embedding_forward(out, b.index, table, nullptr, 1, static_cast<int>(index.size()), width,
                            0, table_rows, nullptr, 0);
}

}  // namespace

ExpertExchange ExpertExchange::plan(parallel::Comm& group, const MoeRouting& r) {
    const int E = group.size(), L = r.experts / E;
    std::vector<int32_t> counts(static_cast<std::size_t>(r.experts)),
        received(static_cast<std::size_t>(r.experts));
    for (int e = 0; e < r.experts; ++e) counts[static_cast<std::size_t>(e)] = r.count(e);
    group.all_to_all(kernels::ConstPtr(counts.data(), kernels::DType::i32),
                     kernels::Ptr(received.data(), kernels::DType::i32),
                     static_cast<std::size_t>(L));
    return ExpertExchange(E, group.rank(), r, std::move(received));
}

ExpertExchange::ExpertExchange(int ranks, int rank, const MoeRouting& r,
                               std::vector<int32_t> received)
    : received_(std::move(received)) {
    const int L = r.experts / ranks;
    const auto at = [L](int q, int j) { return static_cast<std::size_t>(q * L + j); };
    // Where block (q, j) starts in the receipt, sender by sender.
    std::vector<int32_t> start(received_.size());
    int32_t rows = 0;
    for (int q = 0; q < ranks; ++q) {
        sent_.push_back(static_cast<std::size_t>(r.offset[at(q + 1, 0)] - r.offset[at(q, 0)]));
        const int32_t before = rows;
        for (int j = 0; j < L; ++j) {
            start[at(q, j)] = rows;
            rows += received_[at(q, j)];
        }
        got_.push_back(static_cast<std::size_t>(rows - before));
    }
    local_.first = rank * L;
    local_.offset.assign(1, 0);
    to_local_.reserve(static_cast<std::size_t>(rows));
    for (int j = 0; j < L; ++j) {
        for (int q = 0; q < ranks; ++q)
            for (int32_t i = 0; i < received_[at(q, j)]; ++i)
                to_local_.push_back(start[at(q, j)] + i);
        local_.offset.push_back(static_cast<int32_t>(to_local_.size()));
    }
    to_sender_.resize(to_local_.size());
    for (std::size_t m = 0; m < to_local_.size(); ++m)
        to_sender_[static_cast<std::size_t>(to_local_[m])] = static_cast<int32_t>(m);
}

std::vector<std::size_t> ExpertExchange::elements(const std::vector<std::size_t>& rows,
                                                  int width) const {
    std::vector<std::size_t> out(rows.size());
    for (std::size_t q = 0; q < rows.size(); ++q)
        out[q] = rows[q] * static_cast<std::size_t>(width);
    return out;
}

parallel::Request ExpertExchange::start_dispatch(const ExchangeBuffers& b,
                                                 kernels::ConstPtr permuted, int width) const {
    return b.group.iall_to_all_v(permuted, elements(sent_, width), b.staging,
                                 elements(got_, width));
}

void ExpertExchange::finish_dispatch(const ExchangeBuffers& b, parallel::Request& sent,
                                     kernels::Ptr local, int width) const {
    sent.wait();
    gather(b, local, b.staging, local_.rows(), to_local_, width);
}

parallel::Request ExpertExchange::start_combine(const ExchangeBuffers& b, kernels::ConstPtr local,
                                                kernels::Ptr permuted, int width) const {
    gather(b, b.staging, local, local_.rows(), to_sender_, width);
    return b.group.iall_to_all_v(b.staging, elements(got_, width), permuted,
                                 elements(sent_, width));
}

void ExpertExchange::combine(const ExchangeBuffers& b, kernels::ConstPtr local,
                             kernels::Ptr permuted, int width) const {
    start_combine(b, local, permuted, width).wait();
}

}  // namespace trident::model
