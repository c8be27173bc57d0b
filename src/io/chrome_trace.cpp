// Chrome traces of training steps (see chrome_trace.h).
#include "io/chrome_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "io/output_file.h"

namespace trident::io {

namespace {

const char* name_of(SpanKind kind) {
    switch (kind) {
        case SpanKind::forward:
            return "forward";
        case SpanKind::backward:
            return "backward";
        case SpanKind::backward_input:
            return "backward_input";
        case SpanKind::backward_weight:
            return "backward_weight";
        case SpanKind::send:
            return "send";
        case SpanKind::recv:
            return "recv";
        case SpanKind::optimizer:
            return "optimizer";
        case SpanKind::reduce_scatter:
            return "reduce_scatter";
        case SpanKind::all_gather:
            return "all_gather";
        case SpanKind::tp_gemm:
            return "tp_gemm";
        case SpanKind::tp_exchange:
            return "tp_exchange";
        case SpanKind::ep_shared:
            return "ep_shared";
        case SpanKind::ep_wgrad:
            return "ep_wgrad";
        case SpanKind::ep_attention:
            return "ep_attention";
        case SpanKind::ep_exchange:
            return "ep_exchange";
        case SpanKind::count_:
            break;
    }
    return "?";
}

// Data-parallel collectives go on a row (thread) of their own under the rank's compute.
bool data_parallel(SpanKind kind) {
    return kind == SpanKind::reduce_scatter || kind == SpanKind::all_gather;
}

// The row (thread) of a span in its rank's track.
int row_of(SpanKind kind) {
    if (data_parallel(kind)) return 1;
    if (kind == SpanKind::tp_exchange) return 2;
    return kind == SpanKind::ep_exchange ? 3 : 0;
}

const char* category_of(SpanKind kind) {
    if (data_parallel(kind)) return "data-parallel";
    if (kind == SpanKind::tp_exchange) return "tensor-parallel";
    if (kind == SpanKind::ep_exchange) return "expert-parallel";
    return kind == SpanKind::send || kind == SpanKind::recv ? "p2p" : "compute";
}

// A span travels as doubles: kind, microbatch, chunk, start and duration in microseconds,
// thread (a kernel thread id is exact in a double), issue time.
constexpr std::size_t kValuesPerSpan = 7;

// Every rank's values, concatenated in rank order: the group's longest list sets the size.
std::vector<double> gather(parallel::Comm& group, const std::vector<double>& mine) {
    int64_t longest = static_cast<int64_t>(mine.size());
    group.all_reduce(&longest, 1, parallel::ReduceOp::max);
    std::vector<double> padded(mine);
    padded.resize(static_cast<std::size_t>(longest) + 1, -1.0);  // -1 ends a rank's list
    std::vector<double> all(padded.size() * static_cast<std::size_t>(group.size()));
    group.all_gather(padded.data(), all.data(), padded.size());
    return all;
}

}  // namespace

double TraceRecorder::now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void TraceRecorder::add(SpanKind kind, int microbatch, int chunk, double start_us, double end_us) {
    spans_.push_back(
        Span{kind, microbatch, chunk, start_us, end_us, static_cast<long>(::gettid()), start_us});
}

void TraceRecorder::add_transfer(SpanKind kind, int chunk, const parallel::Request::Transfer& moved,
                                 double issued_us) {
    if (moved.thread == 0) return add(kind, -1, chunk, issued_us, now_us());
    spans_.push_back(Span{kind, -1, chunk, moved.start_us, moved.end_us, moved.thread, issued_us});
}

void TraceRecorder::write(const std::string& path, parallel::Comm& tensor, parallel::Comm& pipeline,
                          const std::vector<std::string>& track_names) const {
    std::vector<double> mine;
    for (const Span& s : spans_)
        mine.insert(mine.end(), {static_cast<double>(s.kind), static_cast<double>(s.microbatch),
                                 static_cast<double>(s.chunk), s.start_us, s.end_us - s.start_us,
                                 static_cast<double>(s.thread), s.issued_us});
    // Two rounds (tensor, then pipeline): every rank's list, tagged by its place.
    const std::vector<double> by_tensor = gather(tensor, mine);
    const std::vector<double> everyone = gather(pipeline, by_tensor);
    if (tensor.rank() != 0 || pipeline.rank() != 0) return;

    struct Event {
        int track;
        SpanKind kind;
        int mb, chunk;
        double start, duration;
        long thread;
        double issued;
    };
    std::vector<Event> events;
    const std::size_t per_tensor = by_tensor.size() / static_cast<std::size_t>(tensor.size());
    const std::size_t per_stage = everyone.size() / static_cast<std::size_t>(pipeline.size());
    for (int pp = 0; pp < pipeline.size(); ++pp)
        for (int tp = 0; tp < tensor.size(); ++tp) {
            const double* list = everyone.data() + static_cast<std::size_t>(pp) * per_stage +
                                 static_cast<std::size_t>(tp) * per_tensor;
            for (std::size_t i = 0; i + kValuesPerSpan <= per_tensor && list[i] >= 0;
                 i += kValuesPerSpan)
                events.push_back(Event{tp + tensor.size() * pp, static_cast<SpanKind>(list[i]),
                                       static_cast<int>(list[i + 1]), static_cast<int>(list[i + 2]),
                                       list[i + 3], list[i + 4], static_cast<long>(list[i + 5]),
                                       list[i + 6]});
        }
    double origin = events.empty() ? 0 : events.front().start;
    for (const Event& e : events) origin = std::min(origin, e.start);

    // Put together in memory, then written whole or not at all (output_file.h).
    std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    char line[512];
    bool first = true;
    for (std::size_t r = 0; r < track_names.size(); ++r) {
        text += std::string(first ? "" : ",\n") +
                "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
                ", \"args\": {\"name\": \"" + track_names[r] + "\"}}";
        std::snprintf(line, sizeof line,
                      ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %zu, \"tid\": 1, "
                      "\"args\": {\"name\": \"data-parallel\"}}",
                      r);
        text += line;
        std::snprintf(line, sizeof line,
                      ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %zu, \"tid\": 2, "
                      "\"args\": {\"name\": \"tensor-parallel\"}}",
                      r);
        text += line;
        std::snprintf(line, sizeof line,
                      ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %zu, \"tid\": 3, "
                      "\"args\": {\"name\": \"expert-parallel\"}}",
                      r);
        text += line;
        first = false;
    }
    for (const Event& e : events) {
        std::snprintf(line, sizeof line,
                      ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, "
                      "\"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"microbatch\": %d, "
                      "\"chunk\": %d, \"thread\": %ld, \"issued\": %.3f}}",
                      name_of(e.kind), category_of(e.kind), e.track, row_of(e.kind),
                      e.start - origin, e.duration, e.mb, e.chunk, e.thread, e.issued - origin);
        text += line;
    }
    text += "\n]}\n";
    write_file_atomically(path, text);
}

}  // namespace trident::io
