// cuDNN's fused causal attention as backend-API graphs (see attention.h and cudnn_graph.h).
//
// The graphs are the pattern cuDNN's fused-attention engines recognise: the operations, their
// order and their tensors' types as the cuDNN frontend's SDPA nodes (its releases 1.10 to
// 1.23) emit them for a causal mask without padding, bias, dropout or ALiBi:
//   forward:  S = Q K^T; S *= scale; causal mask (row >= column, else -inf); M = max_row S;
//             E = exp(S - M); Z = sum_row E; stats = M + log Z; P = E / Z; O = P V
//   backward: sum = rowsum(dO * O); P = exp(S * scale - stats) causally masked;
//             dV = P^T dO; dS = P * (dO V^T - sum) * scale; dK = dS^T Q; dQ = dS K
// In the backward the mask comes after the stats are subtracted, where those releases place
// it (earlier ones masked the scaled scores first, a form the engines also take). The mask
// takes one of two forms: on cuDNN 9.21 and later (the release from which the frontend emits
// it) one diagonal-band mask operation, tried first; else, or where that graph does not build,
// four pointwise operations, the row and column indices being INT32 tensors computed at the
// graph's compute precision (fp32), as the frontend emits them before 9.21.
// Q, K and V are read in place from the packed qkv (B,T,3·channels) through strides: head h of row
// t is at t*3·channels + h*hs (+channels for K, +2·channels for V); K and V enter transposed by
// swapping their last two strides. Intermediates are fp32, the matrix inputs bf16/fp16.
#include <cudnn.h>
#include <dlfcn.h>

#include <cmath>
#include <limits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

// The shapes of one case, as cuDNN's (batch, heads, rows, columns) dimensions and strides.
struct Shapes {
    int64_t b, n, t, hs, channels;
    Dims heads() const { return {b, n, t, hs}; }
    Dims packed_strides() const {
        return {t * 3 * channels, hs, 3 * channels, 1};
    }  // q, k, v in qkv
    Dims transposed_strides() const {
        return {t * 3 * channels, hs, 1, 3 * channels};
    }  // k^T, v^T in qkv
    Dims transposed() const { return {b, n, hs, t}; }
    Dims out_strides() const {
        return {t * channels, hs, channels, 1};
    }  // out, dout (B,T,channels)
    Dims scores() const { return {b, n, t, t}; }
    Dims score_strides() const { return {n * t * t, t * t, t, 1}; }
    Dims scores_transposed_strides() const { return {n * t * t, t * t, 1, t}; }
    Dims rows() const { return {b, n, t, 1}; }
    Dims row_strides() const { return {n * t, t, 1, 1}; }
};

// cuDNN before 9.10 wants the lowest float rather than -inf for masked scores.
float masked_score() {
    return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                     : -std::numeric_limits<float>::infinity();
}

// The causal mask's two forms (above).
enum class MaskForm { band_operation, pointwise };

const char* mask_text(MaskForm form) {
    return form == MaskForm::band_operation ? "one diagonal-band operation"
                                            : "four pointwise operations";
}

// scores where row >= column, masked_score() elsewhere.
int64_t causal_mask(CudnnGraph& g, const Shapes& s, int64_t scores, MaskForm form) {
    if (form == MaskForm::band_operation) {
        const int64_t masked = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
        g.causal_band_mask(masked, scores, g.scalar(masked_score()));
        return masked;
    }
    const int64_t row = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_INT32);
    const int64_t column = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, row, scores, -1, -1, CUDNN_DATA_FLOAT, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, column, scores, -1, -1, CUDNN_DATA_FLOAT, 3);
    const int64_t keep = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_BOOLEAN);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, keep, row, column, -1, CUDNN_DATA_BOOLEAN);
    const int64_t masked = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, masked, scores, g.scalar(masked_score()), keep);
    return masked;
}

// The 16-bit types the fused-attention engines take; cudnn_attention_refusal turns others away
// before a graph is described.
cudnnDataType_t cudnn_type(DType type) {
    switch (type) {
        case DType::bf16:
            return CUDNN_DATA_BFLOAT16;
        case DType::f16:
            return CUDNN_DATA_HALF;
        default:
            throw Error(std::string("internal: cuDNN attention on ") + name_of(type) + " tensors");
    }
}

// The memory-bound tensors of the forward graph: Q, K^T and V read from qkv, O (B,T,channels) and
// the softmax statistics (B,NH,T,1) written.
struct ForwardTensors {
    int64_t q, k, v, o, stats;
};

ForwardTensors describe_forward(CudnnGraph& f, const Shapes& s, cudnnDataType_t io, float scale,
                                MaskForm form) {
    ForwardTensors t;
    t.q = f.tensor(s.heads(), s.packed_strides(), io);
    t.k = f.tensor(s.transposed(), s.transposed_strides(), io);
    t.v = f.tensor(s.heads(), s.packed_strides(), io);
    t.o = f.tensor(s.heads(), s.out_strides(), io);
    t.stats = f.tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    const int64_t raw = f.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    f.matmul(raw, t.q, t.k);
    const int64_t scaled = f.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    f.pointwise(CUDNN_POINTWISE_MUL, scaled, raw, f.scalar(scale));
    const int64_t masked = causal_mask(f, s, scaled, form);
    const int64_t max = f.virtual_tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    f.reduction(CUDNN_REDUCE_TENSOR_MAX, max, masked);
    const int64_t shifted = f.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    f.pointwise(CUDNN_POINTWISE_SUB, shifted, masked, max);
    const int64_t exps = f.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    f.pointwise(CUDNN_POINTWISE_EXP, exps, shifted);
    const int64_t sum = f.virtual_tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    f.reduction(CUDNN_REDUCE_TENSOR_ADD, sum, exps);
    const int64_t log_sum = f.virtual_tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    f.pointwise(CUDNN_POINTWISE_LOG, log_sum, sum);
    f.pointwise(CUDNN_POINTWISE_ADD, t.stats, max, log_sum);
    // The second product takes the probabilities in the inputs' type.
    const int64_t probs = f.virtual_tensor(s.scores(), s.score_strides(), io);
    f.pointwise(CUDNN_POINTWISE_DIV, probs, exps, sum);
    f.matmul(t.o, probs, t.v);
    return t;
}

// The memory-bound tensors of the backward graph: Q, K^T, V^T, O, dO and the statistics read;
// dQ, dK and dV written into the packed gradient of qkv.
struct BackwardTensors {
    int64_t q, k, v, o, dout, stats, dq, dk, dv;
};

// sum (B,NH,T,1) = rowsum(dO * O), kept in the workspace.
int64_t softmax_sum(CudnnGraph& g, const Shapes& s, const BackwardTensors& t) {
    const int64_t products = g.virtual_tensor(
        s.heads(), {s.n * s.t * s.hs, s.t * s.hs, s.n * s.hs, 1}, CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, products, t.dout, t.o);
    const int64_t row_sums = g.virtual_tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, row_sums, products);
    const int64_t sum = g.workspace_tensor(s.rows(), s.row_strides());
    g.pointwise(CUDNN_POINTWISE_MUL, sum, row_sums, g.scalar(1.0f));
    return sum;
}

// P = exp(S * scale - stats), masked: the forward's probabilities, recomputed.
int64_t recomputed_probs(CudnnGraph& g, const Shapes& s, const BackwardTensors& t, float scale,
                         MaskForm form) {
    const int64_t raw = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.matmul(raw, t.q, t.k);
    const int64_t scaled = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, scaled, raw, g.scalar(scale));
    const int64_t shifted = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_SUB, shifted, scaled, t.stats);
    const int64_t masked = causal_mask(g, s, shifted, form);
    const int64_t probs = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_EXP, probs, masked);
    return probs;
}

BackwardTensors describe_backward(CudnnGraph& g, const Shapes& s, cudnnDataType_t io, float scale,
                                  MaskForm form) {
    BackwardTensors t;
    t.q = g.tensor(s.heads(), s.packed_strides(), io);
    t.k = g.tensor(s.transposed(), s.transposed_strides(), io);
    t.v = g.tensor(s.transposed(), s.transposed_strides(), io);
    t.o = g.tensor(s.heads(), s.out_strides(), io);
    t.dout = g.tensor(s.heads(), s.out_strides(), io);
    t.stats = g.tensor(s.rows(), s.row_strides(), CUDNN_DATA_FLOAT);
    t.dq = g.tensor(s.heads(), s.packed_strides(), io);
    t.dk = g.tensor(s.heads(), s.packed_strides(), io);
    t.dv = g.tensor(s.heads(), s.packed_strides(), io);
    const int64_t sum = softmax_sum(g, s, t);
    const int64_t probs = recomputed_probs(g, s, t, scale, form);

    // dV = P^T dO.
    const int64_t probs_t = g.virtual_tensor(s.scores(), s.scores_transposed_strides(), io);
    g.reshape(probs_t, probs);
    g.matmul(t.dv, probs_t, t.dout);

    // dS = P * (dO V^T - sum) * scale.
    const int64_t dprobs = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.matmul(dprobs, t.dout, t.v);
    const int64_t centred = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_SUB, centred, dprobs, sum);
    const int64_t weighted = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, weighted, centred, probs);
    const int64_t dscores = g.virtual_tensor(s.scores(), s.score_strides(), CUDNN_DATA_FLOAT);
    g.pointwise(CUDNN_POINTWISE_MUL, dscores, weighted, g.scalar(scale));

    // dK = dS^T Q.
    const int64_t dscores_t = g.virtual_tensor(s.scores(), s.scores_transposed_strides(), io);
    g.reshape(dscores_t, dscores);
    g.matmul(t.dk, dscores_t, t.q);

    // dQ = dS K, accumulated in fp32 in the workspace, then rounded.
    const int64_t keys = g.virtual_tensor(s.heads(), s.packed_strides(), io);
    g.reshape(keys, t.k);
    const int64_t dq_accum = g.workspace_tensor(s.heads(), {s.n * s.t * s.hs, s.t * s.hs, s.hs, 1});
    g.matmul(dq_accum, dscores, keys);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, t.dq, dq_accum);
    return t;
}

std::string version_text(int version) {
    return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
           std::to_string(version % 100);
}

// NVRTC as cuDNN looks for it: libnvrtc.so.<CUDA major> (cuDNN's runtime-compiled engines
// compile their kernels with it at graph build time), else the unversioned name.
std::string describe_nvrtc() {
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) cudaGetLastError();
    const std::string versioned =
        runtime > 0 ? "libnvrtc.so." + std::to_string(runtime / 1000) : "libnvrtc.so";
    void* library = dlopen(versioned.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!library) library = dlopen("libnvrtc.so", RTLD_LAZY | RTLD_LOCAL);
    if (!library)
        return "NVRTC not found (" + versioned +
               "): cuDNN's runtime-compiled engines, fused attention among them, cannot build";
    std::string text = "NVRTC";
    using VersionFn = int (*)(int*, int*);
    int major = 0, minor = 0;
    if (auto version = reinterpret_cast<VersionFn>(dlsym(library, "nvrtcVersion"))) {
        if (version(&major, &minor) == 0)
            text.append(" ")
                .append(std::to_string(major))
                .append(".")
                .append(std::to_string(minor));
        Dl_info where{};
        if (dladdr(reinterpret_cast<void*>(version), &where) && where.dli_fname)
            text.append(": ").append(where.dli_fname);
    }
    dlclose(library);
    return text;
}

}  // namespace

int cudnn_version() {
    return static_cast<int>(cudnnGetVersion());
}

std::string describe_cudnn() {
    return "cuDNN " + version_text(cudnn_version()) + " (" + describe_nvrtc() + ")";
}

std::string cudnn_attention_refusal(int version, int sm_major, DType type, int T, int head_size) {
    if (type != DType::bf16 && type != DType::f16)
        return std::string("cuDNN's fused attention takes bf16 or fp16, not ") + name_of(type);
    if (version == 91000 || version == 91001)
        return "cuDNN " + version_text(version) +
               " computes fused attention wrongly (fixed in 9.10.2)";
    const int largest = sm_major == 9 ? 256 : 128;
    if (head_size % 8 != 0 || head_size > largest)
        return "cuDNN's fused attention takes head sizes that are multiples of 8 up to " +
               std::to_string(largest) + " on this GPU, not " + std::to_string(head_size);
    if (T < 2) return "cuDNN's fused attention has no engine for a single row";
    if (T % 128 != 0 && version < 91600)
        return "cuDNN " + version_text(version) +
               " computes the backward wrongly for sequence lengths not a multiple of 128 "
               "(T = " +
               std::to_string(T) + ") without a padding mask (fixed in 9.16)";
    return "";
}

// The two graphs of one (type, B, T, channels, NH) and the ids of their memory-bound tensors; `how`
// says which mask form and engines run them.
struct CudnnAttention::Case {
    bool supported = false;
    std::string why, how;
    std::unique_ptr<CudnnGraph> forward, backward;
    ForwardTensors f;
    BackwardTensors b;
};

CudnnAttention::CudnnAttention(DeviceAllocator& allocator) : allocator_(allocator) {
    const cudnnStatus_t status = cudnnCreate(&handle_);
    if (status != CUDNN_STATUS_SUCCESS) {
        handle_ = nullptr;
        unavailable_ =
            std::string("cuDNN did not start (cudnnCreate: ") + cudnnGetErrorString(status) + ")";
    }
}

CudnnAttention::~CudnnAttention() {
    cases_.clear();
    if (handle_) cudnnDestroy(handle_);
}

namespace {

// Describes and builds c's two graphs with the mask in `form`; false with the reason in c.why.
bool build_case(CudnnAttention::Case& c, cudnnHandle_t handle, const Shapes& s, DType type,
                MaskForm form) {
    const cudnnDataType_t io = cudnn_type(type);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    c.forward = std::make_unique<CudnnGraph>(handle);
    c.f = describe_forward(*c.forward, s, io, scale, form);
    c.backward = std::make_unique<CudnnGraph>(handle);
    c.b = describe_backward(*c.backward, s, io, scale, form);
    std::string why;
    const std::string mask = std::string("the causal mask as ") + mask_text(form);
    if (!c.forward->build(why)) {
        c.why = "cuDNN could not build the forward graph with " + mask + " (" + why + ")";
        return false;
    }
    if (!c.backward->build(why)) {
        c.why = "cuDNN could not build the backward graph with " + mask + " (" + why + ")";
        return false;
    }
    c.how = mask + "; forward " + c.forward->engine() + ", backward " + c.backward->engine();
    return true;
}

}  // namespace

CudnnAttention::Case& CudnnAttention::case_for(DType type, int B, int T, int channels, int NH) {
    auto& slot = cases_[{static_cast<int>(type), B, T, channels, NH}];
    if (slot) return *slot;
    slot = std::make_unique<Case>();
    Case& c = *slot;
    const Shapes s{B, NH, T, channels / NH, channels};
    if (!handle_) {
        c.why = unavailable_;
        return c;
    }
    c.why = cudnn_attention_refusal(cudnn_version(), gpu_properties().major, type, T,
                                    static_cast<int>(s.hs));
    if (!c.why.empty()) return c;
    std::string band_failure;
    if (cudnn_version() >= 92100) {
        if (build_case(c, handle_, s, type, MaskForm::band_operation)) {
            c.supported = true;
            return c;
        }
        band_failure = c.why;
    }
    c.supported = build_case(c, handle_, s, type, MaskForm::pointwise);
    if (c.supported && !band_failure.empty()) c.how += " (" + band_failure + ")";
    return c;
}

std::string CudnnAttention::describe(DType type, int B, int T, int channels, int NH) {
    const Case& c = case_for(type, B, T, channels, NH);
    return c.supported ? "cuDNN fused attention: " + c.how : "no cuDNN fused attention: " + c.why;
}

bool CudnnAttention::supports(DType type, int B, int T, int channels, int NH, std::string* why) {
    Case& c = case_for(type, B, T, channels, NH);
    if (!c.supported && why) *why = c.why;
    return c.supported;
}

CudnnAttention::Case& CudnnAttention::supported_case(DType type, int B, int T, int channels,
                                                     int NH) {
    Case& c = case_for(type, B, T, channels, NH);
    if (!c.supported) throw Error("internal: cuDNN attention used where it is not supported");
    return c;
}

bool CudnnAttention::run(Case& c, CudnnGraph& graph, const char* which,
                         const std::unordered_map<int64_t, void*>& pointers, cudaStream_t stream) {
    // The workspace comes from the caching allocator: after the first step, no cudaMalloc. It
    // is released once the graph is queued (the next user is queued after it on this stream).
    const Scratch workspace(allocator_, graph.workspace_bytes());
    std::string why;
    if (graph.run(pointers, workspace.data(), stream, why)) return true;
    // Refused from now on, with the reason, as a graph that does not build is.
    c.supported = false;
    c.why = std::string("cuDNN failed to run the ") + which + " graph (" + why + ")";
    return false;
}

bool CudnnAttention::forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                             cudaStream_t stream) {
    if (out.dtype != qkv.dtype)
        throw Error("internal: cuDNN attention with out and qkv of different types");
    Case& c = supported_case(qkv.dtype, B, T, channels, NH);
    char* base = static_cast<char*>(const_cast<void*>(qkv.data));
    const std::size_t plane =
        static_cast<std::size_t>(channels) * size_of(qkv.dtype);  // q to k bytes
    return run(c, *c.forward, "forward",
               {{c.f.q, base},
                {c.f.k, base + plane},
                {c.f.v, base + 2 * plane},
                {c.f.o, out.data},
                {c.f.stats, lse}},
               stream);
}

bool CudnnAttention::backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, const float* lse,
                              int B, int T, int channels, int NH, cudaStream_t stream) {
    if (dqkv.dtype != qkv.dtype || dout.dtype != qkv.dtype || out.dtype != qkv.dtype)
        throw Error("internal: cuDNN attention backward with tensors of different types");
    Case& c = supported_case(qkv.dtype, B, T, channels, NH);
    char* base = static_cast<char*>(const_cast<void*>(qkv.data));
    char* grad = static_cast<char*>(dqkv.data);
    const std::size_t plane = static_cast<std::size_t>(channels) * size_of(qkv.dtype);
    return run(c, *c.backward, "backward",
               {{c.b.q, base},
                {c.b.k, base + plane},
                {c.b.v, base + 2 * plane},
                {c.b.o, const_cast<void*>(out.data)},
                {c.b.dout, const_cast<void*>(dout.data)},
                {c.b.stats, const_cast<float*>(lse)},
                {c.b.dq, grad},
                {c.b.dk, grad + plane},
                {c.b.dv, grad + 2 * plane}},
               stream);
}

}  // namespace trident::kernels::cuda
