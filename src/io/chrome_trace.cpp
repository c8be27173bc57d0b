// Chrome traces of training steps (see chrome_trace.h).
#include "io/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "error.h"

namespace trident::io {

namespace {

const char* name_of(SpanKind kind) {
    switch (kind) {
        case SpanKind::forward: return "forward";
        case SpanKind::backward: return "backward";
        case SpanKind::send: return "send";
        case SpanKind::recv: return "recv";
        case SpanKind::optimizer: return "optimizer";
        case SpanKind::count_: break;
    }
    return "?";
}

// A span travels as floats: kind, microbatch, chunk, start (as a high part and a remainder,
// so microseconds since boot survive float), duration.
constexpr std::size_t kFloatsPerSpan = 6;

// Every rank's floats, concatenated in rank order: the group's longest list sets the size.
std::vector<float> gather(parallel::Comm& group, const std::vector<float>& mine) {
    float longest = static_cast<float>(mine.size());
    group.all_reduce(&longest, 1, parallel::ReduceOp::max);
    std::vector<float> padded(mine);
    padded.resize(static_cast<std::size_t>(longest) + 1, -1.0f);  // -1 ends a rank's list
    std::vector<float> all(padded.size() * static_cast<std::size_t>(group.size()));
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
    spans_.push_back(Span{kind, microbatch, chunk, start_us, end_us});
}

void TraceRecorder::write(const std::string& path, parallel::Comm& tensor, parallel::Comm& pipeline,
                          const std::vector<std::string>& track_names) const {
    std::vector<float> mine;
    for (const Span& s : spans_) {
        const float high = static_cast<float>(s.start_us);
        mine.insert(mine.end(), {static_cast<float>(s.kind), static_cast<float>(s.microbatch),
                                 static_cast<float>(s.chunk), high,
                                 static_cast<float>(s.start_us - static_cast<double>(high)),
                                 static_cast<float>(s.end_us - s.start_us)});
    }
    // Two rounds (tensor, then pipeline): every rank's list, tagged by its place.
    const std::vector<float> by_tensor = gather(tensor, mine);
    const std::vector<float> everyone = gather(pipeline, by_tensor);
    if (tensor.rank() != 0 || pipeline.rank() != 0) return;

    struct Event {
        int track;
        SpanKind kind;
        int mb, chunk;
        double start, duration;
    };
    std::vector<Event> events;
    const std::size_t per_tensor = by_tensor.size() / static_cast<std::size_t>(tensor.size());
    const std::size_t per_stage = everyone.size() / static_cast<std::size_t>(pipeline.size());
    for (int pp = 0; pp < pipeline.size(); ++pp)
        for (int tp = 0; tp < tensor.size(); ++tp) {
            const float* list = everyone.data() + static_cast<std::size_t>(pp) * per_stage +
                                static_cast<std::size_t>(tp) * per_tensor;
            for (std::size_t i = 0; i + kFloatsPerSpan <= per_tensor && list[i] >= 0; i += kFloatsPerSpan)
                events.push_back(Event{tp + tensor.size() * pp, static_cast<SpanKind>(list[i]),
                                       static_cast<int>(list[i + 1]), static_cast<int>(list[i + 2]),
                                       static_cast<double>(list[i + 3]) + list[i + 4], list[i + 5]});
        }
    double origin = events.empty() ? 0 : events.front().start;
    for (const Event& e : events) origin = std::min(origin, e.start);

    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error("logging.trace: cannot write '" + path + "': " + std::strerror(errno));
    std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    bool first = true;
    for (std::size_t r = 0; r < track_names.size(); ++r) {
        std::fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %zu, \"args\": "
                        "{\"name\": \"%s\"}}",
                     first ? "" : ",\n", r, track_names[r].c_str());
        first = false;
    }
    for (const Event& e : events)
        std::fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, "
                        "\"tid\": 0, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"microbatch\": %d, "
                        "\"chunk\": %d}}",
                     name_of(e.kind),
                     e.kind == SpanKind::send || e.kind == SpanKind::recv ? "p2p" : "compute",
                     e.track, e.start - origin, e.duration, e.mb, e.chunk);
    std::fprintf(f, "\n]}\n");
    if (std::fclose(f) != 0) throw Error("logging.trace: write to '" + path + "' failed");
}

}  // namespace trident::io
