// AdamW on state streamed from its file (optimizer.offload: nvme; see adamw.h and
// optim/offload_store.h): each chunk of the master weights and moments goes up to the device
// buffer chunk_ (laid out as the store's: master, m, v of `count` elements each), is updated
// there by the same kernel as state kept on the device, and comes back to be written behind.
#include <algorithm>

#include "optim/adamw.h"

namespace trident::optim {

using data_parallel::OwnedPart;

namespace {

// Calls visit(part, lo, hi) for each part (OwnedPart or Range: offset, count, state) with
// state elements [lo, hi) in the chunk, in order.
template <typename Part, typename Visit>
void in_chunk(const std::vector<Part>& parts, const OffloadStore::Chunk& c, Visit visit) {
    for (const Part& p : parts) {
        const std::size_t lo = std::max(p.state, c.first);
        const std::size_t hi = std::min(p.state + p.count, c.first + c.count);
        if (lo < hi) visit(p, lo, hi);
    }
}

}  // namespace

kernels::Ptr AdamW::param_of(std::size_t at, std::size_t offset) const {
    return param_chunk_.data() ? param_chunk_.data() + at : params_.owned(offset);
}

void AdamW::step_offloaded(float lr, float grad_scale) {
    const bool first = step_ == 0;
    ++step_;
    data_parallel::ParamFile* file = data_parallel_.param_file();
    store_->stream(OffloadStore::Pass::update, [&](const OffloadStore::Chunk& c) {
        const std::size_t n = c.count;
        float* master = chunk_.f32();
        float *m = master + n, *v = master + 2 * n;
        ops_.upload(master, c.master, 3 * n * sizeof(float));
        // The shard's state order is its own (ZeRO-3): the chunk's parameters are elements
        // [c.first, c.first + n) of the file. Padding stays zero, as in memory.
        if (file && first) {
            file->read(c.first, n, param_host_.data());
            ops_.upload(param_chunk_.data().data, param_host_.data(),
                        n * kernels::size_of(params_.dtype()));
        } else if (file) {
            ops_.zero(param_chunk_.data(), n);
        }
        // Before the first update the master weights are taken from the parameters.
        if (first)
            in_chunk(data_parallel_.owned(), c,
                     [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                         ops_.convert(chunk_.data() + (lo - c.first),
                                      param_of(lo - c.first, o.offset + lo - o.state), hi - lo);
                     });
        in_chunk(ranges_, c, [&](const Range& r, std::size_t lo, std::size_t hi) {
            const std::size_t at = lo - c.first, offset = r.offset + (lo - r.state);
            ops_.adamw_update(master + at, grads_.owned(offset), m + at, v + at, hi - lo, lr,
                              static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                              static_cast<float>(cfg_.eps),
                              r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_,
                              grad_scale, param_of(at, offset));
        });
        ops_.download(c.master, master, 3 * n * sizeof(float));
        if (file) {
            ops_.download(param_host_.data(), param_chunk_.data().data,
                          n * kernels::size_of(params_.dtype()));
            file->write(c.first, n, param_host_.data());
        }
    });
}

void AdamW::params_from_store() {
    store_->stream(OffloadStore::Pass::read, [&](const OffloadStore::Chunk& c) {
        ops_.upload(chunk_.f32(), c.master, c.count * sizeof(float));
        in_chunk(data_parallel_.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     ops_.convert(params_.owned(o.offset + lo - o.state),
                                  chunk_.data() + (lo - c.first), hi - lo);
                 });
    });
}

AdamW::State AdamW::state_from_store() const {
    State s;
    s.step = step_;
    s.master.assign(size_, 0.0f);
    s.m.assign(size_, 0.0f);
    s.v.assign(size_, 0.0f);
    store_->stream(OffloadStore::Pass::read, [&](const OffloadStore::Chunk& c) {
        in_chunk(
            data_parallel_.owned(), c, [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                const std::size_t at = lo - c.first, offset = o.offset + (lo - o.state);
                // Before the first update the master weights are the parameters.
                if (step_ == 0)
                    ops_.copy_to_host(s.master.data() + offset, params_.owned(offset), hi - lo);
                else
                    std::copy(c.master + at, c.master + at + (hi - lo), s.master.data() + offset);
                std::copy(c.m + at, c.m + at + (hi - lo), s.m.data() + offset);
                std::copy(c.v + at, c.v + at + (hi - lo), s.v.data() + offset);
            });
    });
    return s;
}

void AdamW::restore_into_store(const State& s) {
    store_->stream(OffloadStore::Pass::write, [&](const OffloadStore::Chunk& c) {
        in_chunk(data_parallel_.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     const std::size_t at = lo - c.first, offset = o.offset + (lo - o.state);
                     std::copy_n(s.master.data() + offset, hi - lo, c.master + at);
                     std::copy_n(s.m.data() + offset, hi - lo, c.m + at);
                     std::copy_n(s.v.data() + offset, hi - lo, c.v + at);
                 });
    });
    step_ = s.step;
}

}  // namespace trident::optim
