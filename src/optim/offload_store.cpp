// The optimizer state streamed from and to a file (see offload_store.h).
#include "optim/offload_store.h"

#include <algorithm>

namespace trident::optim {

namespace {

constexpr int kBuffers = 3;  // read-ahead, update, write-behind

}  // namespace

OffloadStore::OffloadStore(const std::string& dir, int rank, std::size_t elements,
                           std::size_t arrays, std::size_t chunk)
    : elements_(elements),
      arrays_(arrays),
      chunk_(std::max<std::size_t>(1, std::min(chunk, elements))),
      chunks_((elements + chunk_ - 1) / chunk_),
      buffers_(static_cast<std::size_t>(kBuffers) * arrays * chunk_, 0.0f),
      file_(dir, "optimizer_state.rank" + std::to_string(rank),
            static_cast<std::uint64_t>(elements) * arrays * sizeof(float),
            static_cast<std::uint64_t>(elements) * arrays * sizeof(float),
            "this rank's optimizer state needs") {}

OffloadStore::Chunk OffloadStore::chunk_at(std::size_t k, int buffer) {
    const std::size_t first = k * chunk_, count = std::min(chunk_, elements_ - first);
    float* base = buffers_.data() + static_cast<std::size_t>(buffer) * arrays_ * chunk_;
    Chunk c{first, count, {}};
    for (std::size_t a = 0; a < arrays_; ++a) c.arrays[a] = base + a * count;
    return c;
}

void OffloadStore::stream(Pass pass, const std::function<void(const Chunk&)>& visit) {
    file_.check_still_there();
    const bool reads = pass != Pass::write, writes = pass != Pass::read;
    std::vector<std::uint64_t> last(kBuffers, 0);  // each buffer's last transfer
    std::uint64_t read_ahead = reads && chunks_ > 0 ? post(false, 0, 0) : 0;
    for (std::size_t k = 0; k < chunks_; ++k) {
        const int b = static_cast<int>(k % kBuffers), next = static_cast<int>((k + 1) % kBuffers);
        // The queue runs in order: chunk k-2's write-behind from `next` precedes this read.
        const std::uint64_t this_read = read_ahead;
        if (reads && k + 1 < chunks_) read_ahead = last[next] = post(false, k + 1, next);
        file_.wait(reads ? this_read : last[b]);
        if (file_.failed()) break;
        visit(chunk_at(k, b));
        if (writes) last[b] = post(true, k, b);
    }
    file_.wait_all();
    file_.throw_failure();
}

std::uint64_t OffloadStore::post(bool write, std::size_t k, int buffer) {
    const Chunk c = chunk_at(k, buffer);
    const std::size_t element = arrays_ * sizeof(float);
    const std::size_t bytes = c.count * element;
    const std::uint64_t at = static_cast<std::uint64_t>(c.first) * element;
    return write ? file_.post_write(c.master(), bytes, at) : file_.post_read(c.master(), bytes, at);
}

}  // namespace trident::optim
