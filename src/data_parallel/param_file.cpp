// ZeRO-3's parameter shard in a file (see param_file.h).
#include "data_parallel/param_file.h"

#include <cstring>

namespace trident::data_parallel {

namespace {

std::vector<std::size_t> part_offsets(const model::FlatBuffer& params) {
    std::vector<std::size_t> offsets;
    std::size_t at = 0;
    for (std::size_t u = 0; u < params.units().size(); ++u) {
        offsets.push_back(at);
        at += params.part_size(u);
    }
    return offsets;
}

}  // namespace

ParamFile::ParamFile(kernels::Ops& ops, model::FlatBuffer& params, const std::string& dir, int rank,
                     std::uint64_t state_bytes)
    : ops_(ops),
      params_(params),
      element_bytes_(kernels::size_of(params.dtype())),
      part_offsets_(part_offsets(params)),
      file_(dir, "param_shard.rank" + std::to_string(rank), at(params.shard_size()),
            at(params.shard_size()) + state_bytes,
            "this rank's parameter shard and optimizer state need") {}

void ParamFile::fetch(std::size_t u) {
    if (reads_.count(u)) return;
    Read& r = reads_[u];
    r.host.resize(params_.part_size(u) * element_bytes_);
    r.seq = file_.post_read(r.host.data(), r.host.size(), at(part_offsets_[u]));
}

void ParamFile::fetched(std::size_t u, kernels::Ptr to) {
    fetch(u);
    const auto it = reads_.find(u);
    file_.wait(it->second.seq);
    // A failed read leaves zeros; check() reports it where every rank agrees.
    if (file_.failed()) std::memset(it->second.host.data(), 0, it->second.host.size());
    ops_.upload(to.data, it->second.host.data(), it->second.host.size());
    reads_.erase(it);
}

void ParamFile::forget_reads() {
    file_.wait_all();
    reads_.clear();
}

void ParamFile::write(std::size_t first, std::size_t count, const void* from) {
    file_.wait(file_.post_write(from, count * element_bytes_, at(first)));
    file_.throw_failure();
}

void ParamFile::read(std::size_t first, std::size_t count, void* to) {
    file_.wait(file_.post_read(to, count * element_bytes_, at(first)));
    file_.throw_failure();
}

void ParamFile::check() {
    file_.wait_all();
    file_.throw_failure();
    file_.check_still_there();
}

void ParamFile::hold_shard() {
    params_.hold_shard();
    std::vector<char> host(at(params_.shard_size()));
    read(0, params_.shard_size(), host.data());
    ops_.upload(params_.shard().data, host.data(), host.size());
    check();
}

void ParamFile::let_go_shard(bool unchanged) {
    if (!unchanged) {
        std::vector<char> host(at(params_.shard_size()));
        ops_.download(host.data(), params_.shard().data, host.size());
        write(0, params_.shard_size(), host.data());
    }
    params_.let_go_shard();
    check();
}

}  // namespace trident::data_parallel
