// A Chrome trace (chrome://tracing, Perfetto) of chosen training steps: every rank's
// forward, backward, send, receive and optimizer spans, and on a second row of its track
// its data-parallel reduce-scatters and all-gathers (when their data moved, on the thread
// that moved it, where the Comm says; else from their start to when they were seen complete;
// `chunk` is the bucket), and under parallel.tp_overlap on a third row the tensor group's ring
// steps (`chunk` the block of rows that moved) while the GEMM's pieces ("tp_gemm", `chunk` the
// block computed) run under the forward and backward spans, and under parallel.expert on a
// fourth row expert parallelism's dispatch of an MoE layer's rows ("ep_exchange") while its
// shared experts compute ("ep_shared"); gathered to rank 0 and written as one
// JSON file, one track per rank. Each span's args name the thread that ran it ("thread": the
// kernel's id) and when it was asked for ("issued": a transfer may wait for a free core or its
// peers).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace trident::io {

enum class SpanKind {
    forward,
    backward,
    backward_input,
    backward_weight,
    send,
    recv,
    optimizer,
    reduce_scatter,
    all_gather,
    tp_gemm,       // a GEMM's piece on one block of rows (model/tensor_rows.h)
    tp_exchange,   // a ring step of the tensor group moving one block of rows
    ep_shared,     // an MoE layer's shared experts (model/moe_mlp.cpp), under its dispatch
    ep_wgrad,      // an MoE layer's weight gradients, under the combine of its input gradients
    ep_attention,  // the attention weight gradients of the layer above, under an MoE dispatch
    ep_exchange,   // the expert group's all-to-all moving an MoE layer's rows to their experts
                   // or back
    count_
};

class TraceRecorder {
public:
    // Spans are kept only while recording() is on.
    void set_recording(bool on) { recording_ = on; }
    bool recording() const { return recording_; }

    // Now, in microseconds of the steady clock (shared by the processes of one machine).
    static double now_us();
    // A span run by the calling thread.
    void add(SpanKind kind, int microbatch, int chunk, double start_us, double end_us);
    // A non-blocking call's span: when and on which thread its data moved, where the Comm
    // says (a call run by MpiComm's worker thread); else from `issued_us` to now, on the
    // calling thread.
    void add_transfer(SpanKind kind, int chunk, const parallel::Request::Transfer& moved,
                      double issued_us);

    // Gathers every rank's spans over the tensor then the pipeline group (collective) and,
    // on the rank that is 0 in both, writes them to `path`; track_names[r] names the track
    // of r = tensor rank + tensor size * pipeline rank. The file appears whole or not at all;
    // a failure throws trident::Error naming it and the errno (on the writing rank alone).
    void write(const std::string& path, parallel::Comm& tensor, parallel::Comm& pipeline,
               const std::vector<std::string>& track_names) const;

private:
    struct Span {
        SpanKind kind;
        int microbatch, chunk;
        double start_us, end_us;
        long thread;       // the kernel's id of the thread that ran it
        double issued_us;  // when the caller asked for it (start_us but for transfers)
    };
    bool recording_ = false;
    std::vector<Span> spans_;
};

// Records the span of one scope (e.g. an executor instruction) when tracing.
class ScopedSpan {
public:
    ScopedSpan(TraceRecorder* trace, SpanKind kind, int microbatch, int chunk)
        : trace_(trace && trace->recording() ? trace : nullptr),
          kind_(kind),
          mb_(microbatch),
          chunk_(chunk),
          start_(trace_ ? TraceRecorder::now_us() : 0) {}
    ~ScopedSpan() {
        if (trace_) trace_->add(kind_, mb_, chunk_, start_, TraceRecorder::now_us());
    }
    ScopedSpan(const ScopedSpan&) = delete;
    ScopedSpan& operator=(const ScopedSpan&) = delete;

private:
    TraceRecorder* trace_;
    SpanKind kind_;
    int mb_, chunk_;
    double start_;
};

}  // namespace trident::io
