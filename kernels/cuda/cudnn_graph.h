// CudnnGraph: an operation graph for cuDNN 9's backend ("graph") API, built from tensors and
// a handful of operations, compiled once into an execution plan and then run many times.
//
// The cuDNN frontend (a header library) is the usual way to write such graphs; it is not a
// dependency here, so this file speaks the C API directly: every tensor and operation is a
// backend descriptor given its attributes one by one. A graph is described first (tensors by
// id, operations by the ids they read and write), then build() creates and finalises the
// descriptors, asks cuDNN's heuristics for engine configurations and keeps the first whose
// plan finalises and says its workspace size: heuristic mode A first, then mode B and the
// fallback list, each of which may offer engines the one before did not. Failing all, build()
// returns false with cuDNN's reason, and callers fall back to their own kernels; so does run() when
// cuDNN fails to execute the plan. engine() says which engine was kept and which heuristic found
// it.
//
// Tensors are 4-d (cuDNN's fused attention works on (batch, heads, rows, columns)). A
// virtual tensor is an intermediate that never reaches memory; a scalar is passed by value
// from the host; the others are bound to device pointers by id at each run. A workspace
// tensor is a non-virtual intermediate the graph needs memory for: run() places it in the
// workspace after cuDNN's own part.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace trident::kernels::cuda {

using Dims = std::array<int64_t, 4>;

class CudnnGraph {
public:
    explicit CudnnGraph(cudnnHandle_t handle) : handle_(handle) {}
    ~CudnnGraph();
    CudnnGraph(const CudnnGraph&) = delete;
    CudnnGraph& operator=(const CudnnGraph&) = delete;

    // ---- description -------------------------------------------------------------------
    // A tensor bound to memory at run time, by its id.
    int64_t tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type);
    int64_t virtual_tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type);
    // A non-virtual intermediate placed in the workspace (float elements, packed by strides).
    int64_t workspace_tensor(const Dims& dims, const Dims& strides);
    int64_t scalar(float value);

    // y = op(x[, b[, t]]), computed in `math` precision. axis: GEN_INDEX's dimension.
    void pointwise(cudnnPointwiseMode_t mode, int64_t y, int64_t x, int64_t b = -1, int64_t t = -1,
                   cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1);
    // y = reduction of x over the dimensions where y has extent 1 and x does not.
    void reduction(cudnnReduceTensorOp_t op, int64_t y, int64_t x);
    // c = a @ b over the last two dimensions, batched over the first two.
    void matmul(int64_t c, int64_t a, int64_t b);
    // y = x seen with y's dimensions and strides (a transpose, in the graphs here).
    void reshape(int64_t y, int64_t x);
    // y = x where the element's row (dimension 2) >= its column (dimension 3), else the scalar
    // `fill`: the causal mask as the one diagonal-band operation of cuDNN 9.20 and later
    // (builds fail on earlier releases, which lack the operation).
    void causal_band_mask(int64_t y, int64_t x, int64_t fill);

    // ---- compilation and execution -----------------------------------------------------------
    // Builds the execution plan; false (with `why`) when cuDNN has no engine for the graph.
    bool build(std::string& why);
    // The engine build() kept: "engine 8 (heuristic mode A, configuration 1 of 3)".
    const std::string& engine() const { return engine_; }
    // Bytes of device workspace run() needs.
    std::size_t workspace_bytes() const { return plan_workspace_ + intermediates_bytes_; }
    // Runs the plan; `pointers` maps the id of every memory-bound tensor to its device address.
    // False, with cuDNN's reason in `why`, when cuDNN fails to run it (an engine that built
    // but cannot launch on this GPU, say): the caller's own kernels can then take the case.
    bool run(const std::unordered_map<int64_t, void*>& pointers, void* workspace,
             cudaStream_t stream, std::string& why);

private:
    struct Tensor {
        Dims dims, strides;
        cudnnDataType_t type;
        bool is_virtual, by_value, in_workspace;
        float value;                       // by_value
        std::size_t workspace_offset = 0;  // in_workspace, after the plan's own workspace
        cudnnBackendDescriptor_t descriptor = nullptr;
    };
    enum class OpKind { pointwise, reduction, matmul, reshape, band_mask };
    struct Op {
        OpKind kind;
        int mode;  // cudnnPointwiseMode_t or cudnnReduceTensorOp_t
        int64_t y, x, b, t;
        cudnnDataType_t math;
        int64_t axis;
    };

    int64_t add(Tensor t);
    bool finalize_descriptors(std::string& why);
    bool choose_plan(cudnnBackendDescriptor_t graph, std::string& why);

    cudnnHandle_t handle_;
    std::unordered_map<int64_t, Tensor> tensors_;
    std::vector<int64_t> order_;  // tensor ids in creation order
    std::vector<Op> ops_;
    std::vector<cudnnBackendDescriptor_t> owned_;  // every descriptor but the tensors'
    cudnnBackendDescriptor_t plan_ = nullptr;
    std::size_t plan_workspace_ = 0, intermediates_bytes_ = 0;
    std::string engine_;
    int64_t next_id_ = 1;
};

}  // namespace trident::kernels::cuda
