// Fp32Views: how a backend runs its fp32 kernels on arguments of any float element type
// (fp32, bf16, fp16), the bookkeeping both backends share.
//
// For the length of one op each argument is seen as an fp32 array: an fp32 buffer as it is, a
// 16-bit one widened into scratch (exactly); commit() rounds the scratch of every output back
// into its buffer, to nearest even. So a 16-bit op reads 16-bit values, computes in fp32 and
// stores 16-bit values, as a GPU kernel with fp32 accumulation does, and one set of fp32
// kernels serves every type and every mix of types. Arguments that alias (dropout in place,
// dlogits over logits) share one scratch array, whichever is asked for first.
//
// Where the scratch lives and how it is converted is the backend's Storage:
//   float* acquire(std::size_t index, std::size_t count)  scratch of `count` floats for the
//                                                          index-th view of this op
//   void release(std::size_t index, float* scratch)        the op is done (queued) with it
//   void widen(float* scratch, ConstPtr from, std::size_t count)
//   void narrow(Ptr to, const float* scratch, std::size_t count)
// kernels/cpu/fp32_views.h keeps host arrays between ops and converts on the cores;
// kernels/cuda/fp32_views.h takes device blocks and queues conversion kernels on the compute
// stream.
//
// Rounding back is commit(), called once the op has run (or is queued), rather than the
// destructor's work: on the GPU it launches kernels, and a launch that fails must throw, which
// a destructor must not. Views that go out of scope with outputs not committed while no
// exception is on its way are a bug in the op, and end the process with a message.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace trident::kernels {

template <typename Storage>
class Fp32Views {
public:
    explicit Fp32Views(Storage storage)
        : storage_(std::move(storage)), exceptions_(std::uncaught_exceptions()) {}
    ~Fp32Views() {
        bool pending = false;
        for (std::size_t i = 0; i < views_.size(); ++i) {
            pending = pending || views_[i].written;
            storage_.release(i, views_[i].scratch);
        }
        if (pending && std::uncaught_exceptions() == exceptions_) {
            std::fprintf(stderr,
                         "trident: internal error: an op's fp32 views were not committed\n");
            std::abort();
        }
    }
    Fp32Views(const Fp32Views&) = delete;
    Fp32Views& operator=(const Fp32Views&) = delete;

    // An input of `count` elements (null stays null).
    const float* in(ConstPtr p, std::size_t count) {
        return view(p.data, p.dtype, count, true, false);
    }
    // An output the op overwrites entirely.
    float* out(Ptr p, std::size_t count) { return view(p.data, p.dtype, count, false, true); }
    // An output the op reads and adds into (+=).
    float* inout(Ptr p, std::size_t count) { return view(p.data, p.dtype, count, true, true); }

    // Rounds every output's scratch into its buffer.
    void commit() {
        for (View& v : views_) {
            if (v.written)
                storage_.narrow(Ptr(const_cast<void*>(v.data), v.dtype), v.scratch, v.count);
            v.written = false;
        }
    }

private:
    struct View {
        const void* data;
        DType dtype;
        std::size_t count;
        float* scratch;
        bool widened;  // holds the buffer's values
        bool written;  // to be rounded back by commit()
    };

    float* view(const void* data, DType dtype, std::size_t count, bool read, bool write) {
        if (data == nullptr) return nullptr;
        switch (dtype) {
            case DType::f32:
                return static_cast<float*>(const_cast<void*>(data));
            case DType::bf16:
            case DType::f16:
                break;
            default:
                throw Error(std::string("internal: an fp32 view of ") + name_of(dtype) +
                            " elements");
        }
        for (View& v : views_) {
            if (v.data != data) continue;
            // An alias: the same elements under another argument's name. Every op asks for
            // one extent of a buffer; a larger one would leave the scratch short.
            if (count > v.count)
                throw Error("internal: one buffer seen through fp32 views of different sizes");
            if (read && !v.widened) storage_.widen(v.scratch, ConstPtr(data, dtype), v.count);
            v.widened = v.widened || read;
            v.written = v.written || write;
            return v.scratch;
        }
        float* scratch = storage_.acquire(views_.size(), count);
        views_.push_back(View{data, dtype, count, scratch, read, write});
        if (read) storage_.widen(scratch, ConstPtr(data, dtype), count);
        return scratch;
    }

    Storage storage_;
    int exceptions_;  // uncaught at construction
    std::vector<View> views_;
};

}  // namespace trident::kernels
