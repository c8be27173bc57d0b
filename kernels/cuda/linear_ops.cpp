// The linear layer on the GPU: cuBLASLt's products and the bias kernels, chosen by the element
// types of the arguments (see linear_ops.h).
#include "kernels/cuda/linear_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/dispatch.h"

namespace trident::kernels::cuda {

void LinearOps::matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N,
                               int channels, int OC) {
    // out (N,OC) = inp (N,channels) @ weight^T, weight stored (OC,channels), plus the bias in
    // the epilogue.
    if (inp.dtype == weight.dtype && Gemm::supports(inp.dtype, out.dtype) &&
        all_of_type(out.dtype, {bias})) {
        product(out, inp, false, weight, true, N, OC, channels, 0.0f, bias);
        return;
    }
    auto v = views();
    product(v.out(out, std::size_t(N) * OC), v.in(inp, std::size_t(N) * channels), false,
            v.in(weight, std::size_t(OC) * channels), true, N, OC, channels, 0.0f, v.in(bias, OC));
    v.commit();
}

void LinearOps::matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                                ConstPtr weight, int N, int channels, int OC) {
    const DType ab = dout.dtype;
    const bool direct = inp.dtype == dout.dtype && weight.dtype == dout.dtype &&
                        (!dweight || Gemm::supports(ab, dweight.dtype)) &&
                        (!dinp || Gemm::supports(ab, dinp.dtype));
    auto v = views();
    const Ptr dinp_ = direct ? dinp : Ptr(v.inout(dinp, std::size_t(N) * channels));
    const Ptr dweight_ = direct ? dweight : Ptr(v.inout(dweight, std::size_t(OC) * channels));
    const ConstPtr dout_ = direct ? dout : ConstPtr(v.in(dout, std::size_t(N) * OC));
    const ConstPtr inp_ = direct ? inp : ConstPtr(v.in(inp, std::size_t(N) * channels));
    const ConstPtr weight_ = direct ? weight : ConstPtr(v.in(weight, std::size_t(OC) * channels));
    // dinp (N,channels) += dout (N,OC) @ weight (OC,channels); dweight (OC,channels) += dout^T
    // @ inp (N,channels).
    if (dinp_) product(dinp_, dout_, false, weight_, false, N, channels, OC, 1.0f, ConstPtr());
    if (dweight_) product(dweight_, dout_, true, inp_, false, OC, channels, N, 1.0f, ConstPtr());
    if (dbias) {
        const Scratch scratch(allocator_, bias_grad_scratch(N, OC) * sizeof(float));
        dispatch(dout.dtype, [&](auto e) {
            using E = decltype(e);
            bias_grad(dbias, scratch.floats(), as<E>(dout), N, OC, stream_);
        });
    }
    v.commit();
}

void LinearOps::add_bias(Ptr out, ConstPtr bias, int N, int OC) {
    if (all_of_type(out.dtype, {bias})) {
        dispatch(out.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::add_bias(as<E>(out), as<E>(bias), N, OC, stream_);
        });
        return;
    }
    auto v = views();
    cuda::add_bias(v.inout(out, std::size_t(N) * OC), v.in(bias, OC), N, OC, stream_);
    v.commit();
}

void LinearOps::product(Ptr out, ConstPtr a, bool trans_a, ConstPtr b, bool trans_b, int rows,
                        int cols, int inner, float beta, ConstPtr bias) {
    GemmCall call;
    call.rows = rows;
    call.cols = cols;
    call.inner = inner;
    call.a = a;
    call.trans_a = trans_a;
    call.b = b;
    call.trans_b = trans_b;
    call.d = out;
    call.beta = beta;
    if (bias) {
        call.epilogue = Epilogue::bias;
        call.bias = bias;
    }
    gemm_.run(call, stream_);
}

}  // namespace trident::kernels::cuda
