// The op set's host transfers with conversion, a sum of squares read back at once, and the
// grouped products group by group, shared by every backend (see ops.h).
#include "kernels/ops.h"

#include <string>
#include <vector>

#include "kernels/error.h"

namespace trident::kernels {

void Ops::copy_to_host(float* host, ConstPtr device, std::size_t count) {
    std::vector<uint16_t> staging(device.dtype == DType::f32 ? 0 : count);
    copy_to_host(host, device, count, staging.data());
}

void Ops::copy_from_host(Ptr device, const float* host, std::size_t count) {
    std::vector<uint16_t> staging(device.dtype == DType::f32 ? 0 : count);
    copy_from_host(device, host, count, staging.data());
}

void Ops::copy_to_host(float* host, ConstPtr device, std::size_t count, uint16_t* staging) {
    if (device.dtype == DType::f32) {
        download(host, device.data, count * sizeof(float));
        return;
    }
    download(staging, device.data, count * sizeof(uint16_t));
    widen(host, ConstPtr(staging, device.dtype), count);
}

void Ops::copy_from_host(Ptr device, const float* host, std::size_t count, uint16_t* staging) {
    if (device.dtype == DType::f32) {
        upload(device.data, host, count * sizeof(float));
        return;
    }
    narrow(Ptr(staging, device.dtype), host, count);
    upload(device.data, staging, count * sizeof(uint16_t));
}

namespace {

[[noreturn]] void no_document_attention(const Ops& ops) {
    throw Error(std::string("attention within documents (data.documents: mask) is not built on "
                            "the ") +
                ops.name() + " backend");
}

}  // namespace

void Ops::document_attention_forward(Ptr out, Ptr saved, ConstPtr qkv, const int32_t* starts, int B,
                                     int T, int channels, int NH, float drop_prob, uint64_t seed,
                                     int head_begin, int heads_total) {
    if (starts) no_document_attention(*this);
    attention_forward(out, saved, qkv, B, T, channels, NH, drop_prob, seed, head_begin,
                      heads_total);
}

void Ops::document_attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                      ConstPtr saved, const int32_t* starts, int B, int T,
                                      int channels, int NH, float drop_prob, uint64_t seed,
                                      int head_begin, int heads_total) {
    if (starts) no_document_attention(*this);
    attention_backward(dqkv, dout, qkv, out, saved, B, T, channels, NH, drop_prob, seed, head_begin,
                       heads_total);
}

void Ops::document_attention_rebuild(Ptr saved, ConstPtr qkv, const int32_t* starts, int B, int T,
                                     int channels, int NH, float drop_prob) {
    if (starts) no_document_attention(*this);
    attention_rebuild(saved, qkv, B, T, channels, NH, drop_prob);
}

double Ops::sum_of_squares(ConstPtr x, std::size_t count) {
    const Ptr total = allocate(1, DType::f64);  // zero-filled
    add_sum_of_squares(static_cast<double*>(total.data), x, count);
    double sum = 0.0;
    download(&sum, total.data, sizeof(sum));
    release(total.data);
    return sum;
}

// Group by group: rows offsets[g] .. offsets[g+1] with weights[g]; an empty group is no call
// (a product of no rows is nothing to add).
void Ops::grouped_matmul_forward(Ptr out, ConstPtr inp, const ConstPtr* weights,
                                 const int32_t* offsets, int G, int channels, int OC) {
    for (int g = 0; g < G; ++g) {
        const std::size_t first = static_cast<std::size_t>(offsets[g]);
        const int rows = offsets[g + 1] - offsets[g];
        if (rows > 0)
            matmul_forward(out + first * OC, inp + first * channels, weights[g], nullptr, rows,
                           channels, OC);
    }
}

void Ops::grouped_matmul_backward(Ptr dinp, const Ptr* dweights, ConstPtr dout, ConstPtr inp,
                                  const ConstPtr* weights, const int32_t* offsets, int G,
                                  int channels, int OC) {
    for (int g = 0; g < G; ++g) {
        const std::size_t first = static_cast<std::size_t>(offsets[g]);
        const int rows = offsets[g + 1] - offsets[g];
        if (rows == 0) continue;
        matmul_backward(dinp ? dinp + first * channels : Ptr(), dweights ? dweights[g] : Ptr(),
                        nullptr, dout + first * OC, inp ? inp + first * channels : ConstPtr(),
                        dinp ? weights[g] : ConstPtr(), rows, channels, OC);
    }
}

}  // namespace trident::kernels
