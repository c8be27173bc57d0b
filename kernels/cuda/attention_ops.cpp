// The model's attention on the GPU, cuDNN or the flash kernels per shape (see attention_ops.h).
#include "kernels/cuda/attention_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp32_views.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

std::string describe(const AttentionShape& s) {
    char text[160];
    std::snprintf(text, sizeof(text), "B %d, T %d, %d heads of %d, %s, %s", s.B, s.T, s.NH,
                  s.NH > 0 ? s.channels / s.NH : 0, name_of(s.type),
                  s.drop_prob > 0 ? "with attention dropout" : "without dropout");
    return text;
}

std::size_t elements(const AttentionShape& s) {
    return static_cast<std::size_t>(s.B) * s.T * s.channels;
}

// out = in rounded to out's type (or widened), types known at run time.
void convert_into(Ptr out, ConstPtr in, std::size_t count, cudaStream_t stream) {
    dispatch(out.dtype, [&](auto to) {
        dispatch(in.dtype, [&](auto from) {
            using TOut = decltype(to);
            using TIn = decltype(from);
            convert(as<TOut>(out), as<TIn>(in), count, stream);
        });
    });
}

// The log's line for a choice of kernels, or the error's text where none can run the shape.
std::string describe_choice(const AttentionShape& s, bool cudnn, bool flash,
                            const std::string& why) {
    const std::string where = "attention (" + describe(s) + "): ";
    if (cudnn) return where + "cuDNN fused attention";
    if (flash) return where + "the flash-attention kernels, as " + why;
    return where + "no kernel: the flash-attention kernels take heads of 1 to " +
           std::to_string(kFlashMaxHeadSize) + " elements and " + why;
}

}  // namespace

AttentionOps::AttentionOps(DeviceAllocator& allocator, cudaStream_t stream)
    : allocator_(allocator), stream_(stream), cudnn_(allocator) {}

// ---- the choice ----------------------------------------------------------------------------

AttentionOps::Choice& AttentionOps::choose(const AttentionShape& shape, bool announce) {
    const auto key = std::make_tuple(static_cast<int>(shape.type), shape.drop_prob > 0.0f, shape.B,
                                     shape.T, shape.channels, shape.NH);
    const auto known = choices_.find(key);
    if (known != choices_.end()) return known->second;
    Choice choice{Path::cudnn, ""};
    if (shape.drop_prob > 0.0f)
        choice = {Path::flash, "cuDNN's dropout mask is not the model's"};
    else if (!cudnn_.supports(shape.type, shape.B, shape.T, shape.channels, shape.NH, &choice.why))
        choice.path = Path::flash;
    if (choice.path == Path::flash && !flash_attention_supports(shape.channels / shape.NH))
        choice.path = Path::none;
    Choice& kept = choices_.emplace(key, choice).first->second;
    if (announce && kept.path != Path::none)
        std::fprintf(stderr, "trident: %s\n", describe(shape, kept).c_str());
    return kept;
}

std::string AttentionOps::describe(const AttentionShape& shape, const Choice& choice) {
    return describe_choice(shape, choice.path == Path::cudnn, choice.path == Path::flash,
                           choice.why);
}

AttentionOps::Path AttentionOps::path(const AttentionShape& shape) {
    const Choice& choice = choose(shape, true);
    if (choice.path == Path::none) throw Error(describe(shape, choice));
    return choice.path;
}

void AttentionOps::leave_cudnn(const AttentionShape& shape) {
    Choice& choice = choose(shape, false);
    cudnn_.supports(shape.type, shape.B, shape.T, shape.channels, shape.NH, &choice.why);
    choice.path = flash_attention_supports(shape.channels / shape.NH) ? Path::flash : Path::none;
    const std::string said = describe(shape, choice);
    if (choice.path == Path::none) throw Error(said);
    std::fprintf(stderr, "trident: %s from now on\n", said.c_str());
}

bool AttentionOps::try_cudnn(const AttentionShape& s) {
    const std::size_t n = elements(s), width = size_of(s.type);
    const Scratch qkv(allocator_, 3 * n * width), out(allocator_, n * width),
        dout(allocator_, n * width), grad(allocator_, 3 * n * width),
        lse(allocator_, static_cast<std::size_t>(s.B) * s.NH * s.T * sizeof(float));
    // Finite values, not zeros: every byte 0x3C (0.0115 in bf16, 1.06 in fp16).
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(qkv.data(), 0x3C, 3 * n * width, stream_));
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(dout.data(), 0x3C, n * width, stream_));
    const bool ran =
        cudnn_.forward(Ptr(out.data(), s.type), lse.floats(), ConstPtr(qkv.data(), s.type), s.B,
                       s.T, s.channels, s.NH, stream_) &&
        cudnn_.backward(Ptr(grad.data(), s.type), ConstPtr(dout.data(), s.type),
                        ConstPtr(qkv.data(), s.type), ConstPtr(out.data(), s.type), lse.floats(),
                        s.B, s.T, s.channels, s.NH, stream_);
    synchronize();  // a fault inside the run throws here, at start-up
    return ran;
}

std::string AttentionOps::prepare(const AttentionShape& shape) {
    std::string said;
    // Training draws the dropout mask; evaluation and generation run the same shape without.
    for (const float drop_prob : {shape.drop_prob, 0.0f}) {
        AttentionShape s = shape;
        s.drop_prob = drop_prob;
        Choice& choice = choose(s, false);
        if (choice.path == Path::cudnn && !try_cudnn(s)) {
            cudnn_.supports(s.type, s.B, s.T, s.channels, s.NH, &choice.why);
            choice.path = flash_attention_supports(s.channels / s.NH) ? Path::flash : Path::none;
        }
        const std::string line = describe(s, choice);
        if (choice.path == Path::none) throw Error(line);
        said += line + "\n";
        if (drop_prob == 0.0f) break;
    }
    return said;
}

// ---- the ops -------------------------------------------------------------------------------

bool AttentionOps::cudnn_forward(Ptr out, float* lse, ConstPtr qkv, const AttentionShape& s) {
    if (out.dtype == qkv.dtype)
        return cudnn_.forward(out, lse, qkv, s.B, s.T, s.channels, s.NH, stream_);
    // cuDNN writes qkv's type; the output is rounded into out's from there.
    const Scratch o(allocator_, elements(s) * size_of(qkv.dtype));
    if (!cudnn_.forward(Ptr(o.data(), qkv.dtype), lse, qkv, s.B, s.T, s.channels, s.NH, stream_))
        return false;
    convert_into(out, ConstPtr(o.data(), qkv.dtype), elements(s), stream_);
    return true;
}

// out null: the statistics alone. The kernels are those of qkv's type (flash_geometry.cuh:
// tensor cores for 16-bit, fp32 arithmetic for fp32) whatever out's type, so that rebuild,
// which has no out, runs the forward's: an output of another type is rounded into from qkv's.
void AttentionOps::flash_forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels,
                                 int NH, float drop_prob, uint64_t seed, int head_begin,
                                 int heads_total, const int32_t* starts) {
    const std::size_t BTC = static_cast<std::size_t>(B) * T * channels;
    if (out && out.dtype != qkv.dtype) {
        const Scratch o(allocator_, BTC * size_of(qkv.dtype));
        flash_forward(Ptr(o.data(), qkv.dtype), lse, qkv, B, T, channels, NH, drop_prob, seed,
                      head_begin, heads_total, starts);
        convert_into(out, ConstPtr(o.data(), qkv.dtype), BTC, stream_);
        return;
    }
    dispatch(qkv.dtype, [&](auto e) {
        using E = decltype(e);
        flash_attention_forward(as<E>(out), lse, as<E>(qkv), B, T, channels, NH, drop_prob, seed,
                                head_begin, heads_total, stream_, starts);
    });
}

void AttentionOps::forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob, uint64_t seed, int head_begin, int heads_total,
                           const int32_t* starts) {
    const AttentionShape shape{B, T, channels, NH, qkv.dtype, drop_prob};
    if (!starts && path(shape) == Path::cudnn) {
        if (cudnn_forward(out, lse, qkv, shape)) return;
        leave_cudnn(shape);
    }
    flash_forward(out, lse, qkv, B, T, channels, NH, drop_prob, seed, head_begin, heads_total,
                  starts);
}

// The forward's kernels where the types allow; with mixed types the flash kernels, whose
// backward takes cuDNN's statistics as well (attention.h).
void AttentionOps::backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, const float* lse,
                            int B, int T, int channels, int NH, float drop_prob, uint64_t seed,
                            int head_begin, int heads_total, const int32_t* starts) {
    const AttentionShape shape{B, T, channels, NH, qkv.dtype, drop_prob};
    const std::size_t BTC = elements(shape);
    const bool one_type =
        dqkv.dtype == qkv.dtype && dout.dtype == qkv.dtype && out.dtype == qkv.dtype;
    if (one_type && !starts && path(shape) == Path::cudnn) {
        // cuDNN overwrites its gradient: into scratch, then added (ops.h's +=).
        const Scratch grad(allocator_, 3 * BTC * size_of(qkv.dtype));
        if (cudnn_.backward(Ptr(grad.data(), qkv.dtype), dout, qkv, out, lse, B, T, channels, NH,
                            stream_)) {
            dispatch(qkv.dtype, [&](auto e) {
                using E = decltype(e);
                residual_forward(as<E>(dqkv), as<E>(dqkv), static_cast<const E*>(grad.data()),
                                 3 * BTC, stream_);
            });
            return;
        }
        leave_cudnn(shape);
    }
    const Scratch row_dot(allocator_, static_cast<std::size_t>(B) * NH * T * sizeof(float));
    if (!one_type) {
        Fp32Views v(DeviceScratch(allocator_, stream_));
        flash_attention_backward(v.inout(dqkv, 3 * BTC), row_dot.floats(), v.in(dout, BTC),
                                 v.in(qkv, 3 * BTC), v.in(out, BTC), lse, B, T, channels, NH,
                                 drop_prob, seed, head_begin, heads_total, stream_, starts);
        v.commit();
        return;
    }
    dispatch(qkv.dtype, [&](auto e) {
        using E = decltype(e);
        flash_attention_backward(as<E>(dqkv), row_dot.floats(), as<E>(dout), as<E>(qkv), as<E>(out),
                                 lse, B, T, channels, NH, drop_prob, seed, head_begin, heads_total,
                                 stream_, starts);
    });
}

// The statistics again, by the kernels of the forward (the same shape and drop_prob give the
// same path): cuDNN's has no statistics-only form, so its output goes to scratch; the flash
// kernels are chosen by qkv's type alone (flash_forward).
void AttentionOps::rebuild(float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob, const int32_t* starts) {
    const AttentionShape shape{B, T, channels, NH, qkv.dtype, drop_prob};
    if (!starts && path(shape) == Path::cudnn) {
        const Scratch out(allocator_, elements(shape) * size_of(qkv.dtype));
        if (cudnn_.forward(Ptr(out.data(), qkv.dtype), lse, qkv, B, T, channels, NH, stream_))
            return;
        leave_cudnn(shape);
    }
    flash_forward(Ptr(), lse, qkv, B, T, channels, NH, 0.0f, 0, 0, NH, starts);
}

}  // namespace trident::kernels::cuda
