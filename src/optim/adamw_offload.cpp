// AdamW on state off the device (optimizer.offload: host or nvme; see adamw.h and
// optim/state_store.h), a chunk at a time. nvme: each chunk of the master weights and moments
// goes up to the device buffer chunk_ (laid out as the store's: master, m, v of `count`
// elements each), is updated there by the same kernel as state kept on the device, and comes
// back to be written behind. host: each chunk's gradients come down to a host buffer, the
// chunk is updated in place on host threads by the CPU backend's element loop
// (kernels/host_adamw.h), and its master weights go back up, rounded to the parameters' type.
#include <algorithm>
#include <thread>

#include "kernels/host_adamw.h"
#include "optim/adamw.h"

namespace trident::optim {

using data_parallel::OwnedPart;

namespace {

// Calls visit(part, lo, hi) for each part (OwnedPart or Range: offset, count, state) with
// state elements [lo, hi) in the chunk, in order.
template <typename Part, typename Visit>
void in_chunk(const std::vector<Part>& parts, const StateStore::Chunk& c, Visit visit) {
    for (const Part& p : parts) {
        const std::size_t lo = std::max(p.state, c.first);
        const std::size_t hi = std::min(p.state + p.count, c.first + c.count);
        if (lo < hi) visit(p, lo, hi);
    }
}

// A run of one range's elements in a chunk: at `at` in the chunk, `offset` in the buffers.
struct HostSegment {
    std::size_t at, count, offset;
    bool decay;
};

// Fewest elements worth a thread of their own in the host update.
constexpr std::size_t kElementsPerThread = std::size_t{1} << 13;

// work(begin, end) over [0, count), split evenly over at most `threads` threads (this one
// among them). The update is element by element, so the split does not change its bits.
template <typename Work>
void on_threads(std::size_t count, int threads, Work work) {
    const std::size_t n =
        std::clamp<std::size_t>(count / kElementsPerThread, 1, static_cast<std::size_t>(threads));
    const std::size_t piece = (count + n - 1) / n;
    std::vector<std::thread> others;
    for (std::size_t t = 1; t < n; ++t)
        others.emplace_back(work, std::min(count, t * piece), std::min(count, (t + 1) * piece));
    work(0, std::min(count, piece));
    for (std::thread& t : others) t.join();
}

}  // namespace

kernels::Ptr AdamW::param_of(std::size_t at, std::size_t offset) const {
    return param_chunk_.data() ? param_chunk_.data() + at : params_.owned(offset);
}

void AdamW::step_offloaded(float lr, float grad_scale) {
    const bool first = step_ == 0;
    ++step_;
    store_->stream(StateStore::Pass::update, [&](const StateStore::Chunk& c) {
        if (file_)
            update_on_device(c, first, lr, grad_scale);
        else
            update_on_host(c, first, lr, grad_scale);
    });
}

void AdamW::update_on_device(const StateStore::Chunk& c, bool first, float lr, float grad_scale) {
    data_parallel::ParamFile* file = data_parallel_.param_file();
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
                          r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_, grad_scale,
                          param_of(at, offset));
    });
    ops_.download(c.master, master, 3 * n * sizeof(float));
    if (file) {
        ops_.download(param_host_.data(), param_chunk_.data().data,
                      n * kernels::size_of(params_.dtype()));
        file->write(c.first, n, param_host_.data());
    }
}

void AdamW::update_on_host(const StateStore::Chunk& c, bool first, float lr, float grad_scale) {
    float* grads = host_grads_.as<float>();
    auto* staging = staging_.as<std::uint16_t>();
    if (first)
        in_chunk(data_parallel_.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     ops_.copy_to_host(c.master + (lo - c.first),
                                       params_.owned(o.offset + lo - o.state), hi - lo, staging);
                 });
    // The chunk's ranges: where their gradients land in `grads`, and whether they decay.
    std::vector<HostSegment> segments;
    in_chunk(ranges_, c, [&](const Range& r, std::size_t lo, std::size_t hi) {
        const HostSegment s{lo - c.first, hi - lo, r.offset + (lo - r.state), r.decay};
        ops_.copy_to_host(grads + s.at, grads_.owned(s.offset), s.count, staging);
        segments.push_back(s);
    });
    const auto factors = [&](bool decay) {
        return kernels::AdamwFactors(lr, static_cast<float>(cfg_.beta1),
                                     static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                                     decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_);
    };
    const kernels::AdamwFactors decayed = factors(true), undecayed = factors(false);
    on_threads(c.count, host_threads_, [&](std::size_t begin, std::size_t end) {
        for (const HostSegment& s : segments) {
            const std::size_t lo = std::max(begin, s.at), hi = std::min(end, s.at + s.count);
            if (lo < hi)
                kernels::adamw_elements(s.decay ? decayed : undecayed, c.master, grads, c.m, c.v,
                                        lo, hi, grad_scale, nullptr);
        }
    });
    for (const HostSegment& s : segments)
        ops_.copy_from_host(params_.owned(s.offset), c.master + s.at, s.count, staging);
}

void AdamW::params_from_store() {
    store_->stream(StateStore::Pass::read, [&](const StateStore::Chunk& c) {
        if (!file_) {  // host: rounded on the host, as the update leaves them
            in_chunk(data_parallel_.owned(), c,
                     [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                         ops_.copy_from_host(params_.owned(o.offset + lo - o.state),
                                             c.master + (lo - c.first), hi - lo,
                                             staging_.as<std::uint16_t>());
                     });
            return;
        }
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
    store_->stream(StateStore::Pass::read, [&](const StateStore::Chunk& c) {
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
    store_->stream(StateStore::Pass::write, [&](const StateStore::Chunk& c) {
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
