// The communicators for device buffers under mpirun (two ranks): StagedComm always, NcclComm
// when the ranks have GPUs of their own, against what the plain MPI communicator gives for the
// same host buffers, for each element type: every collective, in place where ZeRO-1 uses it,
// point-to-point messages (out of tag order, blocking and not; NcclComm's through NCCL),
// staging memory that grows between calls, host buffers passed to the same communicator, and
// the traffic counters. Exits 77 on every rank when some rank sees no GPU; with one GPU for
// both ranks NcclComm is not tested (NCCL refuses two ranks on one GPU), which it says.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/stream_uses.h"
#include "kernels/dtype.h"
#include "kernels/random.h"
#include "parallel/cuda/gpu_binding.h"
#include "parallel/cuda/nccl_comm.h"
#include "parallel/cuda/staged_comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/world.h"

using namespace trident;
using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

int failures = 0;

void check(bool ok, const std::string& what, int rank) {
    if (ok) return;
    ++failures;
    std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
}

// A device buffer holding `values` rounded to `t`. Its copies go through the compute stream,
// which the communicators order their work after (and NcclComm's stream before); the legacy
// default stream of a plain cudaMemcpy is not ordered with that non-blocking stream.
struct DeviceArray {
    DType type;
    std::size_t count;
    void* data = nullptr;
    DeviceArray(DType t, const std::vector<float>& values) : type(t), count(values.size()) {
        TRIDENT_CUDA_CHECK(
            cudaMalloc(&data, std::max<std::size_t>(1, count * kernels::size_of(t))));
        std::vector<char> bytes(count * kernels::size_of(t));
        kernels::narrow(Ptr(bytes.data(), t), values.data(), count);
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice,
                                           kernels::cuda::compute_stream()));
        kernels::cuda::synchronize();  // before `bytes` goes
    }
    ~DeviceArray() {
        kernels::cuda::synchronize();  // a collective may still use it
        cudaFree(data);
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    Ptr ptr() const { return Ptr(data, type); }
    std::vector<float> values() const {
        std::vector<char> bytes(count * kernels::size_of(type));
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(bytes.data(), data, bytes.size(), cudaMemcpyDeviceToHost,
                                           kernels::cuda::compute_stream()));
        kernels::cuda::synchronize();
        std::vector<float> out(count);
        kernels::widen(out.data(), ConstPtr(bytes.data(), type), count);
        return out;
    }
};

// The same values on the host, in the buffer's type.
struct HostArray {
    DType type;
    std::vector<char> bytes;
    HostArray(DType t, const std::vector<float>& values)
        : type(t), bytes(values.size() * kernels::size_of(t)) {
        kernels::narrow(Ptr(bytes.data(), t), values.data(), values.size());
    }
    Ptr ptr() { return Ptr(bytes.data(), type); }
    std::vector<float> values() const {
        std::vector<float> out(bytes.size() / kernels::size_of(type));
        kernels::widen(out.data(), ConstPtr(bytes.data(), type), out.size());
        return out;
    }
};

std::vector<float> random_values(std::size_t n, uint64_t seed) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(kernels::normal(seed, i));
    return v;
}

// Every operation on `device_comm` with device buffers gives what `host_comm` gives for host
// copies of them, bit for bit for MPI staging and to rounding for NCCL. A reference of zeros
// would compare equal to a buffer nothing wrote, so none is.
void exercise(parallel::Comm& device_comm, parallel::Comm& host_comm, const std::string& name,
              bool exact) {
    const int rank = device_comm.rank(), size = device_comm.size();
    const auto same = [&](const std::vector<float>& a, const std::vector<float>& b, DType t,
                          const std::string& what) {
        bool ok = a.size() == b.size() &&
                  std::any_of(b.begin(), b.end(), [](float x) { return x != 0.0f; });
        double tolerance = exact ? 0.0 : (t == DType::f32 ? 1e-6 : 1e-2);
        for (std::size_t i = 0; ok && i < a.size(); ++i)
            ok = std::abs(a[i] - b[i]) <= tolerance * (1.0 + std::abs(b[i]));
        check(ok, name + " " + kernels::name_of(t) + " " + what, rank);
    };
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        const std::size_t count = 1000 + 17;
        const std::vector<float> mine = random_values(count * size, 100 + rank);
        {
            DeviceArray d(t, mine);
            HostArray h(t, mine);
            device_comm.all_reduce(d.ptr(), count * size);
            host_comm.all_reduce(h.ptr(), count * size);
            same(d.values(), h.values(), t, "all_reduce");
            device_comm.all_reduce(d.ptr(), count, parallel::ReduceOp::max);
            host_comm.all_reduce(h.ptr(), count, parallel::ReduceOp::max);
            same(d.values(), h.values(), t, "all_reduce max");
        }
        {
            DeviceArray d(t, mine);
            HostArray h(t, mine);
            const std::size_t block = static_cast<std::size_t>(rank) * count;
            device_comm.reduce_scatter(d.ptr(), d.ptr() + block, count);  // in place (ZeRO-1)
            host_comm.reduce_scatter(h.ptr(), h.ptr() + block, count);
            const std::vector<float> dv = d.values(), hv = h.values();
            same(std::vector<float>(dv.begin() + block, dv.begin() + block + count),
                 std::vector<float>(hv.begin() + block, hv.begin() + block + count), t,
                 "reduce_scatter");
            device_comm.all_gather(d.ptr() + block, d.ptr(), count);  // in place
            host_comm.all_gather(h.ptr() + block, h.ptr(), count);
            same(d.values(), h.values(), t, "all_gather");
            // The non-blocking forms give the blocking forms' bits.
            DeviceArray d2(t, mine);
            HostArray h2(t, mine);
            device_comm.ireduce_scatter(d2.ptr(), d2.ptr() + block, count).wait();
            host_comm.ireduce_scatter(h2.ptr(), h2.ptr() + block, count).wait();
            device_comm.iall_gather(d2.ptr() + block, d2.ptr(), count).wait();
            host_comm.iall_gather(h2.ptr() + block, h2.ptr(), count).wait();
            same(d2.values(), h2.values(), t, "ireduce_scatter + iall_gather");
            same(d2.values(), d.values(), t, "non-blocking = blocking");
            device_comm.broadcast(d.ptr(), count, 1);
            host_comm.broadcast(h.ptr(), count, 1);
            same(d.values(), h.values(), t, "broadcast");
        }
        {
            // Two messages each way, received in the opposite order to their sending.
            const int peer = 1 - rank;
            DeviceArray first(t, random_values(count, 7 + rank)),
                second(t, random_values(count, 9 + rank));
            DeviceArray got_first(t, std::vector<float>(count)),
                got_second(t, std::vector<float>(count));
            parallel::Request sent_first = device_comm.isend(first.ptr(), count, peer, 1);
            parallel::Request sent_second = device_comm.isend(second.ptr(), count, peer, 2);
            device_comm.recv(got_second.ptr(), count, peer, 2);
            device_comm.recv(got_first.ptr(), count, peer, 1);
            sent_first.wait();
            sent_second.wait();
            same(got_first.values(), HostArray(t, random_values(count, 7 + peer)).values(), t,
                 "send/recv by tag");
            same(got_second.values(), HostArray(t, random_values(count, 9 + peer)).values(), t,
                 "send/recv by tag (2)");
            // Blocking sends, ordered so that neither rank waits on the other: rank 0 sends
            // first, rank 1 receives first.
            DeviceArray got_third(t, std::vector<float>(count));
            if (rank == 0) device_comm.send(first.ptr(), count, peer, 3);
            device_comm.recv(got_third.ptr(), count, peer, 3);
            if (rank == 1) device_comm.send(first.ptr(), count, peer, 3);
            same(got_third.values(), HostArray(t, random_values(count, 7 + peer)).values(), t,
                 "blocking send/recv");
        }
    }
    // A small reduction, then one that grows the staging memory while the small one's copy
    // back to the device may still be queued.
    {
        const std::size_t large = std::size_t{1} << 22;
        const std::vector<float> a = random_values(7, 300 + rank), b = random_values(large, 400);
        DeviceArray da(DType::f32, a), db(DType::f32, b);
        HostArray ha(DType::f32, a), hb(DType::f32, b);
        device_comm.all_reduce(da.ptr(), a.size());
        device_comm.all_reduce(db.ptr(), large);
        host_comm.all_reduce(ha.ptr(), a.size());
        host_comm.all_reduce(hb.ptr(), large);
        same(da.values(), ha.values(), DType::f32, "all_reduce before the staging grows");
        same(db.values(), hb.values(), DType::f32, "all_reduce that grows the staging");
    }
    // Host buffers through the same communicator, as the trainer passes its scalars.
    float parts[2] = {1.0f + rank, 0.5f};
    device_comm.all_reduce(Ptr(parts), 2);
    check(parts[0] == 3.0f && parts[1] == 1.0f, name + " all_reduce of host buffers", rank);
    // A message between host buffers through the same communicator.
    int32_t mine = 40 + rank, theirs = -1;
    parallel::Request note = device_comm.isend(ConstPtr(&mine, DType::i32), 1, 1 - rank, 4);
    device_comm.recv(Ptr(&theirs, DType::i32), 1, 1 - rank, 4);
    note.wait();
    check(theirs == 41 - rank, name + " a message between host buffers", rank);
    // Control data as the trainer passes it: a double (a norm), an integer (a flag).
    double norm = 1.0 + std::ldexp(static_cast<double>(rank), -40);
    int32_t flag = rank;
    device_comm.all_reduce(&norm, 1);
    device_comm.all_reduce(&flag, 1, parallel::ReduceOp::max);
    check(norm == 2.0 + std::ldexp(1.0, -40) && flag == 1, name + " doubles and integers", rank);
    // The counters: calls of every kind were counted.
    const parallel::CommStats& stats = device_comm.stats();
    check(stats.calls_of(parallel::CommKind::all_reduce) == 11, name + " all_reduce count", rank);
    check(stats.calls_of(parallel::CommKind::send) == 10, name + " send count", rank);
    check(stats.calls_of(parallel::CommKind::recv) == 10, name + " recv count", rank);
}

// A non-blocking collective's buffer is recorded in use until the collective ends
// (kernels/cuda/stream_uses.h), so that the allocator does not hand it out before; a wait on
// the request then lets a release forget it.
void recorded_in_use(parallel::Comm& comm, int rank) {
    DeviceArray d(DType::f32, random_values(1000, 5));
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());   // every earlier use has ended
    kernels::cuda::await_stream_uses(nullptr, 0);  // and is forgotten
    parallel::Request request = comm.iall_reduce(d.ptr(), 1000);
    check(kernels::cuda::pending_stream_uses() == 1,
          "NcclComm iall_reduce records its buffer in use", rank);
    request.wait();
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    kernels::cuda::await_stream_uses(d.data, 1000 * sizeof(float));
    check(kernels::cuda::pending_stream_uses() == 0, "NcclComm's use forgotten once ended", rank);
}

}  // namespace

int main(int argc, char** argv) {
    parallel::World world(argc, argv);
    std::vector<std::string> missing;
    if (!parallel::every_rank_has_gpu(world, missing)) {
        if (world.rank() == 0) std::printf("SKIPPED: %s\n", missing.front().c_str());
        return 77;
    }
    if (world.size() != 2) {
        if (world.rank() == 0) std::printf("run under mpirun -n 2\n");
        return 1;
    }
    const parallel::GpuBinding binding = parallel::bind_gpu(world);
    const cudaStream_t stream = kernels::cuda::compute_stream();
    parallel::MpiComm& host = world.mpi_comm();
    {
        MPI_Comm copy;
        MPI_Comm_dup(MPI_COMM_WORLD, &copy);
        parallel::StagedComm staged(std::make_unique<parallel::MpiComm>(copy), stream);
        exercise(staged, host, "StagedComm", true);
    }
    if (!binding.shared) {
        MPI_Comm copy;
        MPI_Comm_dup(MPI_COMM_WORLD, &copy);
        parallel::NcclComm nccl(std::make_unique<parallel::MpiComm>(copy), stream, true);
        exercise(nccl, host, "NcclComm", false);
        recorded_in_use(nccl, world.rank());
    } else if (world.rank() == 0) {
        std::printf(
            "SKIPPED: NcclComm between two ranks: they share %s (NCCL takes one GPU a rank)\n",
            binding.gpu.c_str());
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world.rank() == 0) std::printf("%s\n", total == 0 ? "all passed" : "FAILED");
    return total == 0 ? 0 : 1;
}
