// Expert parallelism's exchange of one MoE layer's rows (docs/ARCHITECTURE.md, "Mixture of
// experts"): the E ranks of the expert group each compute L = N/E consecutive experts (rank q
// experts q·L ..). A rank's routed rows, permuted by expert (model/moe_routing.h), go to their
// experts' ranks by one all-to-all with per-rank counts, after an all-to-all of the counts
// per expert; the receiver orders what it got expert by expert (each expert's rows from rank
// 0, then rank 1, ...) so that each of its experts' GEMMs runs on contiguous rows, and the
// reverse exchange sends the experts' results back into the senders' permuted order.
//
// Shapes: permuted (K, width) on the sender, K = its choices; local (rows(), width) on the
// experts' rank; the staging buffer holds the larger of the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/moe_routing.h"
#include "parallel/comm.h"

namespace trident::model {

// The rows this rank's experts compute, expert by expert: local expert j (global first + j)
// holds rows offset[j] .. offset[j + 1].
struct ExpertRows {
    int first = 0;
    std::vector<int32_t> offset;

    int experts() const { return static_cast<int>(offset.size()) - 1; }
    int count(int j) const { return offset[j + 1] - offset[j]; }
    int rows() const { return offset.back(); }
};

// Where an exchange moves its bytes: the backend, the expert group, a staging buffer of the
// larger of the two row counts, and an i32 device buffer of the local rows' count.
struct ExchangeBuffers {
    kernels::Ops& ops;
    parallel::Comm& group;
    kernels::Ptr staging;
    int32_t* index = nullptr;
};

class ExpertExchange {
public:
    // Exchanges routing r's counts per expert over the expert group (collective).
    static ExpertExchange plan(parallel::Comm& group, const MoeRouting& r);
    // From the counts a forward received (`received`, see received()), for its backward.
    ExpertExchange(int ranks, int rank, const MoeRouting& r, std::vector<int32_t> received);

    const ExpertRows& local() const { return local_; }
    // (E·L): the rows rank q sent for local expert j at q·L + j.
    const std::vector<int32_t>& received() const { return received_; }

    // local (rows(), width) = the permuted rows (K, width) of every rank for this rank's
    // experts, in two halves so that the caller computes while the rows travel: the exchange
    // started (`permuted` left as it is until it is finished), then waited for and its receipt
    // put in local order.
    parallel::Request start_dispatch(const ExchangeBuffers& b, kernels::ConstPtr permuted,
                                     int width) const;
    void finish_dispatch(const ExchangeBuffers& b, parallel::Request& sent, kernels::Ptr local,
                         int width) const;
    // permuted (K, width) = the local rows' results back on the ranks that sent them: started
    // (`local` read at once; `permuted` and the staging buffer left as they are until it is
    // waited for), or whole.
    parallel::Request start_combine(const ExchangeBuffers& b, kernels::ConstPtr local,
                                    kernels::Ptr permuted, int width) const;
    void combine(const ExchangeBuffers& b, kernels::ConstPtr local, kernels::Ptr permuted,
                 int width) const;

private:
    std::vector<std::size_t> elements(const std::vector<std::size_t>& rows, int width) const;

    std::vector<std::size_t> sent_, got_;  // rows per rank
    std::vector<int32_t> received_;
    // The row of the sender-ordered receipt for each local row, and the reverse.
    std::vector<int32_t> to_local_, to_sender_;
    ExpertRows local_;
};

}  // namespace trident::model
