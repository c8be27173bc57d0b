// Run-time element types to compile-time ones: dispatch(t, f) calls f with a value of the C++
// type of a float DType (float, __nv_bfloat16, __half), so that a templated kernel runs on a
// buffer whose type is known only at run time; as<E>(p) is then the buffer as an E array.
// all_of_type says whether an op's arguments share the one type such a kernel takes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>
#include <string>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

template <typename F>
void dispatch(DType t, F&& f) {
    switch (t) {
        case DType::f32:
            f(float{});
            return;
        case DType::bf16:
            f(__nv_bfloat16{});
            return;
        case DType::f16:
            f(__half{});
            return;
        default:
            throw Error(std::string("internal: a GPU op on ") + name_of(t) + " elements");
    }
}

// Whether every given (non-null) argument is of type t.
inline bool all_of_type(DType t, std::initializer_list<ConstPtr> arguments) {
    for (ConstPtr p : arguments)
        if (p.data != nullptr && p.dtype != t) return false;
    return true;
}

template <typename E>
E* as(Ptr p) {
    return static_cast<E*>(p.data);
}
template <typename E>
const E* as(ConstPtr p) {
    return static_cast<const E*>(p.data);
}

}  // namespace trident::kernels::cuda
