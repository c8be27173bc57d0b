// The state off the device (optimizer.offload: host or nvme; see update.h and
// optim/state_store.h), a chunk at a time. nvme: each chunk of the master weights and state goes
// up to a device buffer of one chunk (laid out as the store's), is updated there as state kept
// on the device would be, and comes back to be written behind. host: each chunk's gradients come
// down to a host buffer, the chunk is updated in place on host threads by the optimizer's host
// loop, and its master weights go back up, rounded to the parameters' type. An optimizer stepping
// whole matrices first streams the chunks for its matrices' inputs (update.h).
#include <algorithm>
#include <string>
#include <thread>

#include "kernels/error.h"
#include "optim/host_store.h"
#include "optim/update.h"

namespace trident::optim {

using data_parallel::OwnedPart;

namespace {

// Calls visit(part, lo, hi) for each part (OwnedPart or OwnedRange: offset, count, state) with
// state elements [lo, hi) in the chunk, in order.
template <typename Part, typename Visit>
void in_chunk(const std::vector<Part>& parts, const StateStore::Chunk& c, Visit visit) {
    for (const Part& p : parts) {
        const std::size_t lo = std::max(p.state, c.first);
        const std::size_t hi = std::min(p.state + p.count, c.first + c.count);
        if (lo < hi) visit(p, lo, hi);
    }
}

// Range r's elements [lo, hi) of the state, as a range of their own.
OwnedRange part_of(const OwnedRange& r, std::size_t lo, std::size_t hi) {
    OwnedRange part = r;
    part.offset = r.offset + (lo - r.state);
    part.count = hi - lo;
    part.state = lo;
    part.grouped = r.grouped + (lo - r.state);
    return part;
}

// The state of the owned ranges from a store's chunks into `s` (before the first update the
// master weights are the parameters), and back. An array kept for one group is read and
// written over that group's ranges only, as on the device; zero over the others.
void read_store(StateStore& store, const UpdateScope& scope, OptimizerState& s, bool first) {
    store.stream(StateStore::Pass::read, [&](const StateStore::Chunk& c) {
        in_chunk(scope.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
            const std::size_t at = lo - c.first, offset = r.offset + (lo - r.state);
            for (std::size_t a = 0; a < scope.arrays; ++a) {
                float* to = s.values[a].data() + offset;
                if (a == 0 && first)
                    scope.ops.copy_to_host(to, scope.params.owned(offset), hi - lo);
                else if (covers(scope.group(a), r.matrix))
                    std::copy(c.arrays[a] + at, c.arrays[a] + at + (hi - lo), to);
            }
        });
    });
}

void write_store(StateStore& store, const UpdateScope& scope, const OptimizerState& s) {
    store.stream(StateStore::Pass::write, [&](const StateStore::Chunk& c) {
        in_chunk(scope.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
            const std::size_t at = lo - c.first, offset = r.offset + (lo - r.state);
            for (std::size_t a = 0; a < scope.arrays; ++a) {
                if (covers(scope.group(a), r.matrix))
                    std::copy_n(s.values[a].data() + offset, hi - lo, c.arrays[a] + at);
                else
                    std::fill_n(c.arrays[a] + at, hi - lo, 0.0f);
            }
        });
    });
}

// An optimizer stepping whole matrices: how the first of an update's two passes visits the
// store, a pass that advances state the matrices keep per element (Muon's momentum) writing
// it back (state_passes).
StateStore::Pass matrix_pass(const UpdateScope& scope) {
    return state_passes(scope.optimizer).written > 1 ? StateStore::Pass::update
                                                     : StateStore::Pass::read;
}

// A chunk's share of the whole-matrix step's input (Optimizer::matrix_input): the elements of
// each matrix range in it, their state at `arrays` (laid out as the chunk's, on the device),
// into the directions.
void matrix_inputs(UpdateScope& scope, const StateStore::Chunk& c, float* const* arrays,
                   const Hyper& h) {
    in_chunk(scope.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
        if (!r.trains || !r.matrix) return;
        scope.optimizer.matrix_input(
            scope.ops, scope.segment(part_of(r, lo, hi), arrays, lo - c.first, nullptr), h,
            scope.directions.data() + lo);
    });
}

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

// The state in host memory, updated there.
class HostPlacement final : public Placement {
public:
    HostPlacement(UpdateScope& scope, std::size_t chunk, int threads)
        : scope_(scope),
          store_(scope.ops, scope.data_parallel.owned_count(), scope.arrays, chunk),
          threads_(threads) {
        const std::size_t staged = std::min(scope.data_parallel.owned_count(), store_.chunk());
        grads_ = kernels::HostBuffer(scope.ops, staged * sizeof(float));
        staging_ = kernels::HostBuffer(scope.ops, staged * sizeof(std::uint16_t));
    }

    void update(const Hyper& h, bool first) override {
        if (scope_.matrices) {
            store_.stream(matrix_pass(scope_),
                          [&](const StateStore::Chunk& c) { matrix_chunk(c, h); });
            scope_.matrices->step(scope_.optimizer, scope_.directions.data(), h, scope_.scratch);
        }
        store_.stream(StateStore::Pass::update,
                      [&](const StateStore::Chunk& c) { update_chunk(c, h, first); });
    }

    // Rounded on the host, as the update leaves them.
    void params_from_master() override {
        store_.stream(StateStore::Pass::read, [&](const StateStore::Chunk& c) {
            in_chunk(scope_.data_parallel.owned(), c,
                     [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                         scope_.ops.copy_from_host(scope_.params.owned(o.offset + lo - o.state),
                                                   c.master() + (lo - c.first), hi - lo,
                                                   staging_.as<std::uint16_t>());
                     });
        });
    }

    void read(OptimizerState& s, bool first) const override {
        read_store(store_, scope_, s, first);
    }
    void write(const OptimizerState& s) override { write_store(store_, scope_, s); }

    // In place in host memory, rounded on the host as params_from_master.
    void add_to_master(std::size_t offset, std::span<const float> delta) override {
        store_.stream(StateStore::Pass::update, [&](const StateStore::Chunk& c) {
            const auto add = [&](std::size_t at, std::size_t state, std::size_t n) {
                const std::size_t lo = std::max(state, c.first);
                const std::size_t hi = std::min(state + n, c.first + c.count);
                if (lo >= hi) return;
                float* master = c.master() + (lo - c.first);
                for (std::size_t i = 0; i < hi - lo; ++i) master[i] += delta[at + lo - state + i];
                scope_.ops.copy_from_host(scope_.params.owned(offset + at + lo - state), master,
                                          hi - lo, staging_.as<std::uint16_t>());
            };
            for_owned_in(scope_.data_parallel.owned(), offset, delta.size(), add);
        });
    }

private:
    // A run of one range's elements in a chunk: at `at` in the chunk.
    struct HostSegment {
        std::size_t at;
        const OwnedRange* range;
    };

    // A chunk's share of the whole-matrix step's input, its gradients brought to host memory
    // (Optimizer::matrix_input_host).
    void matrix_chunk(const StateStore::Chunk& c, const Hyper& h);
    void update_chunk(const StateStore::Chunk& c, const Hyper& h, bool first);

    UpdateScope& scope_;
    mutable HostStore store_;
    int threads_;                  // the host update's
    kernels::HostBuffer grads_;    // (chunk) fp32: a chunk's gradients
    kernels::HostBuffer staging_;  // (chunk) 16-bit: their transfers' staging
};

void HostPlacement::matrix_chunk(const StateStore::Chunk& c, const Hyper& h) {
    in_chunk(scope_.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
        if (!r.trains || !r.matrix) return;
        const OwnedRange part = part_of(r, lo, hi);
        float* grads = grads_.as<float>() + (lo - c.first);
        scope_.ops.copy_to_host(grads, scope_.grads.owned(part.offset), part.count,
                                staging_.as<std::uint16_t>());
        scope_.optimizer.matrix_input_host(
            scope_.segment(part, c.arrays.data(), lo - c.first, nullptr), grads, h,
            scope_.directions.data() + lo);
    });
}

void HostPlacement::update_chunk(const StateStore::Chunk& c, const Hyper& h, bool first) {
    float* grads = grads_.as<float>();
    auto* staging = staging_.as<std::uint16_t>();
    kernels::Ops& ops = scope_.ops;
    if (first)
        in_chunk(scope_.data_parallel.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     ops.copy_to_host(c.master() + (lo - c.first),
                                      scope_.params.owned(o.offset + lo - o.state), hi - lo,
                                      staging);
                 });
    // The chunk's ranges: where their gradients land in `grads`, each segment of the chunk.
    std::vector<Segment> segments;
    std::vector<std::size_t> at;
    in_chunk(scope_.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
        if (!r.trains) return;
        const OwnedRange part = part_of(r, lo, hi);
        at.push_back(lo - c.first);
        segments.push_back(
            scope_.segment(part, c.arrays.data(), at.back(), scope_.params.owned(part.offset)));
        ops.copy_to_host(grads + at.back(), scope_.grads.owned(part.offset), part.count, staging);
    });
    on_threads(c.count, threads_, [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = 0; i < segments.size(); ++i) {
            const std::size_t lo = std::max(begin, at[i]),
                              hi = std::min(end, at[i] + segments[i].count);
            if (lo < hi)
                scope_.optimizer.update_host(segments[i], grads + at[i], h, lo - at[i], hi - at[i]);
        }
    });
    for (std::size_t i = 0; i < segments.size(); ++i)
        ops.copy_from_host(segments[i].params, c.master() + at[i], segments[i].count, staging);
}

// The state in a file, streamed through the device; with ZeRO-3's parameter shard in a file
// too, each chunk's updated parameters streamed to it.
class FilePlacement final : public Placement {
public:
    FilePlacement(UpdateScope& scope, const std::string& dir, int rank, std::size_t chunk)
        : scope_(scope),
          store_(dir, rank, scope.data_parallel.owned_count(), scope.arrays, chunk),
          file_(scope.data_parallel.param_file()) {
        const std::size_t n = std::min(scope.data_parallel.owned_count(), store_.chunk());
        chunk_ = kernels::DeviceBuffer(scope.ops, scope.arrays * n);
        if (file_) {  // the updated parameters go to their file
            param_chunk_ = kernels::DeviceBuffer(scope.ops, n, scope.params.dtype());
            param_host_.resize(param_chunk_.bytes());
        }
    }

    void update(const Hyper& h, bool first) override {
        if (scope_.matrices) {
            store_.stream(matrix_pass(scope_),
                          [&](const StateStore::Chunk& c) { matrix_chunk(c, h); });
            scope_.matrices->step(scope_.optimizer, scope_.directions.data(), h, scope_.scratch);
        }
        store_.stream(StateStore::Pass::update,
                      [&](const StateStore::Chunk& c) { update_chunk(c, h, first); });
    }
    void params_from_master() override;
    void read(OptimizerState& s, bool first) const override {
        read_store(store_, scope_, s, first);
    }
    void write(const OptimizerState& s) override { write_store(store_, scope_, s); }
    const OffloadStore* file() const override { return &store_; }
    // Refused at start-up (src/config/validate.cpp): it would read and write the whole file.
    void add_to_master(std::size_t, std::span<const float>) override {
        throw Error("optimizer.offload: nvme keeps no master weights a rule may move");
    }

private:
    // A chunk up to the device buffer, and its state (as matrix_inputs leaves it) back.
    void matrix_chunk(const StateStore::Chunk& c, const Hyper& h);
    void update_chunk(const StateStore::Chunk& c, const Hyper& h, bool first);
    // Where a streamed update writes the parameter at element `at` of its chunk, buffer
    // element `offset`: param_chunk_ (offloaded parameters) or the shard.
    kernels::Ptr param_of(std::size_t at, std::size_t offset) const {
        return param_chunk_.data() ? param_chunk_.data() + at : scope_.params.owned(offset);
    }

    UpdateScope& scope_;
    mutable OffloadStore store_;
    data_parallel::ParamFile* file_;
    kernels::DeviceBuffer chunk_;        // (arrays · chunk) fp32: a chunk of the file's
    kernels::DeviceBuffer param_chunk_;  // (chunk) the parameters' type: offloaded params
    std::vector<char> param_host_;       // (chunk) the same on the host, to and from the file
};

void FilePlacement::matrix_chunk(const StateStore::Chunk& c, const Hyper& h) {
    const std::size_t n = c.count;
    std::array<float*, kMaxArrays> arrays{};
    for (std::size_t a = 0; a < scope_.arrays; ++a) arrays[a] = chunk_.f32() + a * n;
    scope_.ops.upload(arrays[0], c.master(), scope_.arrays * n * sizeof(float));
    matrix_inputs(scope_, c, arrays.data(), h);
    scope_.ops.download(c.master(), arrays[0], scope_.arrays * n * sizeof(float));
}

void FilePlacement::update_chunk(const StateStore::Chunk& c, const Hyper& h, bool first) {
    const std::size_t n = c.count;
    kernels::Ops& ops = scope_.ops;
    std::array<float*, kMaxArrays> arrays{};
    for (std::size_t a = 0; a < scope_.arrays; ++a) arrays[a] = chunk_.f32() + a * n;
    ops.upload(arrays[0], c.master(), scope_.arrays * n * sizeof(float));
    // The shard's state order is its own (ZeRO-3): the chunk's parameters are elements
    // [c.first, c.first + n) of the file. Padding stays zero, as in memory.
    if (file_ && first) {
        file_->read(c.first, n, param_host_.data());
        ops.upload(param_chunk_.data().data, param_host_.data(),
                   n * kernels::size_of(scope_.params.dtype()));
    } else if (file_) {
        ops.zero(param_chunk_.data(), n);
    }
    // Before the first update the master weights are taken from the parameters.
    if (first)
        in_chunk(scope_.data_parallel.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     ops.convert(chunk_.data() + (lo - c.first),
                                 param_of(lo - c.first, o.offset + lo - o.state), hi - lo);
                 });
    in_chunk(scope_.ranges, c, [&](const OwnedRange& r, std::size_t lo, std::size_t hi) {
        if (!r.trains) return;
        const OwnedRange part = part_of(r, lo, hi);
        scope_.optimizer.update(
            ops,
            scope_.segment(part, arrays.data(), lo - c.first, param_of(lo - c.first, part.offset)),
            h);
    });
    ops.download(c.master(), arrays[0], scope_.arrays * n * sizeof(float));
    if (file_) {
        ops.download(param_host_.data(), param_chunk_.data().data,
                     n * kernels::size_of(scope_.params.dtype()));
        file_->write(c.first, n, param_host_.data());
    }
}

void FilePlacement::params_from_master() {
    store_.stream(StateStore::Pass::read, [&](const StateStore::Chunk& c) {
        scope_.ops.upload(chunk_.f32(), c.master(), c.count * sizeof(float));
        in_chunk(scope_.data_parallel.owned(), c,
                 [&](const OwnedPart& o, std::size_t lo, std::size_t hi) {
                     scope_.ops.convert(scope_.params.owned(o.offset + lo - o.state),
                                        chunk_.data() + (lo - c.first), hi - lo);
                 });
    });
}

}  // namespace

std::unique_ptr<Placement> host_placement(UpdateScope& scope, std::size_t chunk, int threads) {
    scope.whole_arrays = true;
    return std::make_unique<HostPlacement>(scope, chunk, threads);
}

std::unique_ptr<Placement> file_placement(UpdateScope& scope, const std::string& dir, int rank,
                                          std::size_t chunk) {
    scope.whole_arrays = true;
    return std::make_unique<FilePlacement>(scope, dir, rank, chunk);
}

}  // namespace trident::optim
