// The cuDNN backend-API graph (see cudnn_graph.h).
#include "kernels/cuda/cudnn_graph.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

// Descriptor attributes are set through one untyped call; these wrap the common shapes.
cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    return cudnnBackendSetAttribute(d, name, type, count, values);
}
cudnnStatus_t set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                             cudnnBackendDescriptor_t value) {
    return set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
cudnnStatus_t set_type(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnDataType_t value) {
    return set(d, name, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

// The handle attributes of the graph and the plan are marked deprecated in cuDNN 9 (a device
// property descriptor can replace them from 9.8), but every 9.x release accepts them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

// The diagonal-band mask operation and its attributes, in the cuDNN headers from 9.20 on; the
// values of those headers where an older one is compiled against (a newer library may still
// be loaded at run time, and takes them).
#if CUDNN_VERSION >= 92000
constexpr cudnnBackendDescriptorType_t kBandMask =
    CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR;
constexpr cudnnBackendAttributeName_t kBandMaskX = CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_XDESC;
constexpr cudnnBackendAttributeName_t kBandMaskFill = CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_BDESC;
constexpr cudnnBackendAttributeName_t kBandMaskY = CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_YDESC;
constexpr cudnnBackendAttributeName_t kBandMaskComparison =
    CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE;
#else
constexpr auto kBandMask = static_cast<cudnnBackendDescriptorType_t>(44);
constexpr auto kBandMaskX = static_cast<cudnnBackendAttributeName_t>(3000);
constexpr auto kBandMaskFill = static_cast<cudnnBackendAttributeName_t>(3005);
constexpr auto kBandMaskY = static_cast<cudnnBackendAttributeName_t>(3006);
constexpr auto kBandMaskComparison = static_cast<cudnnBackendAttributeName_t>(3007);
#endif

// Accumulates the first failure of a sequence of calls, naming the step.
struct Steps {
    std::string& why;
    bool ok = true;
    bool operator()(cudnnStatus_t status, const char* step) {
        if (ok && status != CUDNN_STATUS_SUCCESS) {
            why = std::string(step) + ": " + cudnnGetErrorString(status);
            ok = false;
        }
        return ok;
    }
};

constexpr std::size_t kWorkspaceAlignment = 256;

using Descriptors = std::vector<cudnnBackendDescriptor_t>;

// Creates and finalises `descriptor`, for the tensor `id` with these properties.
bool finalize_tensor(Steps& step, cudnnBackendDescriptor_t& descriptor, int64_t id,
                     const Dims& dims, const Dims& strides, cudnnDataType_t type, bool is_virtual,
                     bool by_value) {
    if (!step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &descriptor),
              "tensor descriptor"))
        return false;
    const int64_t alignment = 16;
    step(set_type(descriptor, CUDNN_ATTR_TENSOR_DATA_TYPE, type), "tensor type");
    step(set(descriptor, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()),
         "tensor dimensions");
    step(set(descriptor, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()),
         "tensor strides");
    step(set(descriptor, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id), "tensor id");
    step(set(descriptor, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment),
         "tensor alignment");
    step(set(descriptor, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual),
         "tensor virtual");
    step(set(descriptor, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value),
         "tensor by value");
    return step(cudnnBackendFinalize(descriptor), "tensor finalize");
}

// The operations below are described but not finalised; the descriptors they are made of
// join `owned`. Tensors are given by their descriptors; b and t may be null (absent).

// y = mode(x[, b[, t]]) in `math` precision; axis: GEN_INDEX's dimension, or -1.
cudnnBackendDescriptor_t pointwise_operation(Steps& step, Descriptors& owned,
                                             cudnnPointwiseMode_t mode, cudnnDataType_t math,
                                             int64_t axis, cudnnBackendDescriptor_t x,
                                             cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                                             cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t operation = nullptr, inner = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &inner), "pointwise");
    owned.push_back(inner);
    step(set(inner, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode),
         "pointwise mode");
    step(set_type(inner, CUDNN_ATTR_POINTWISE_MATH_PREC, math), "pointwise precision");
    if (axis >= 0)
        step(set(inner, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis), "pointwise axis");
    step(cudnnBackendFinalize(inner), "pointwise finalize");
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &operation),
         "pointwise operation");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, inner),
         "pointwise op");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x), "pointwise x");
    if (b) step(set_descriptor(operation, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b), "pointwise b");
    if (t) step(set_descriptor(operation, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t), "pointwise t");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y), "pointwise y");
    return operation;
}

// y = the reduction `mode` of x in `math` precision.
cudnnBackendDescriptor_t reduction_operation(Steps& step, Descriptors& owned,
                                             cudnnReduceTensorOp_t mode, cudnnDataType_t math,
                                             cudnnBackendDescriptor_t x,
                                             cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t operation = nullptr, inner = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &inner), "reduction");
    owned.push_back(inner);
    step(set(inner, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode),
         "reduction operator");
    step(set_type(inner, CUDNN_ATTR_REDUCTION_COMP_TYPE, math), "reduction precision");
    step(cudnnBackendFinalize(inner), "reduction finalize");
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &operation),
         "reduction operation");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_REDUCTION_DESC, inner), "reduction op");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x), "reduction x");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y), "reduction y");
    return operation;
}

// c = a @ b in `math` precision.
cudnnBackendDescriptor_t matmul_operation(Steps& step, Descriptors& owned, cudnnDataType_t math,
                                          cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                          cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t operation = nullptr, inner = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, &inner), "matmul");
    owned.push_back(inner);
    step(set_type(inner, CUDNN_ATTR_MATMUL_COMP_TYPE, math), "matmul precision");
    step(cudnnBackendFinalize(inner), "matmul finalize");
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &operation),
         "matmul operation");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_MATMUL_DESC, inner), "matmul op");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a), "matmul a");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b), "matmul b");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c), "matmul c");
    return operation;
}

// y = x seen with y's dimensions and strides.
cudnnBackendDescriptor_t reshape_operation(Steps& step, cudnnBackendDescriptor_t x,
                                           cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t operation = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &operation),
         "reshape operation");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x), "reshape x");
    step(set_descriptor(operation, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y), "reshape y");
    return operation;
}

// y = x where row >= column, else fill: one diagonal-band mask operation, right bound only.
cudnnBackendDescriptor_t band_mask_operation(Steps& step, cudnnBackendDescriptor_t x,
                                             cudnnBackendDescriptor_t fill,
                                             cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t operation = nullptr;
    const cudnnPointwiseMode_t keep = CUDNN_POINTWISE_CMP_GE;
    if (!step(cudnnBackendCreateDescriptor(kBandMask, &operation), "band mask operation"))
        return nullptr;
    step(set_descriptor(operation, kBandMaskX, x), "band mask x");
    step(set_descriptor(operation, kBandMaskFill, fill), "band mask fill");
    step(set_descriptor(operation, kBandMaskY, y), "band mask y");
    step(set(operation, kBandMaskComparison, CUDNN_TYPE_POINTWISE_MODE, 1, &keep),
         "band mask comparison");
    return operation;
}

// The finalised operation graph of `operations`, or null; it joins `owned`.
cudnnBackendDescriptor_t operation_graph(Steps& step, cudnnHandle_t handle, Descriptors& operations,
                                         Descriptors& owned) {
    cudnnBackendDescriptor_t graph = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph), "graph");
    if (!step.ok) return nullptr;
    owned.push_back(graph);
    step(set(graph, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle), "graph handle");
    step(set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(operations.size()), operations.data()),
         "graph operations");
    if (!step(cudnnBackendFinalize(graph), "graph finalize")) return nullptr;
    return graph;
}

// The engine configurations cuDNN's heuristic `mode` offers for `graph`, best first, into
// `configs`; they and the heuristic's descriptor join `owned`.
bool engine_configs(Steps& step, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                    Descriptors& owned, Descriptors& configs) {
    cudnnBackendDescriptor_t heuristics = nullptr;
    step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heuristics),
         "heuristics");
    if (!step.ok) return false;
    owned.push_back(heuristics);
    step(set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph),
         "heuristics graph");
    step(set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode),
         "heuristics mode");
    if (!step(cudnnBackendFinalize(heuristics), "heuristics finalize")) return false;
    int64_t available = 0;
    if (!step(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr),
              "heuristics count"))
        return false;
    if (available == 0) {
        step.why = "no engine supports this graph";
        return false;
    }
    configs.resize(static_cast<std::size_t>(available));
    for (auto& config : configs) {
        step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &config),
             "engine config");
        owned.push_back(config);
    }
    int64_t returned = 0;
    if (!step(cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned,
                                       configs.data()),
              "heuristics results"))
        return false;
    configs.resize(static_cast<std::size_t>(returned));
    return true;
}

// The plan of one engine configuration, finalised and with its workspace size, or null with
// the failing step in `why`.
cudnnBackendDescriptor_t plan_of(cudnnHandle_t handle, cudnnBackendDescriptor_t config,
                                 int64_t& workspace, std::string& why) {
    cudnnBackendDescriptor_t plan = nullptr;
    Steps step{why};
    if (!step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan),
              "plan descriptor"))
        return nullptr;
    step(set(plan, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle), "plan handle");
    step(set_descriptor(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config), "plan config");
    step(cudnnBackendFinalize(plan), "plan finalize");
    // A plan whose workspace is not known cannot be given its memory: the next one is tried.
    int64_t returned = 0;
    workspace = 0;
    step(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                  1, &returned, &workspace),
         "plan workspace size");
    if (step.ok && (returned != 1 || workspace < 0))
        step(CUDNN_STATUS_BAD_PARAM, "plan workspace size");
    if (step.ok) return plan;
    cudnnBackendDestroyDescriptor(plan);
    return nullptr;
}

// cuDNN's global index of the engine of `config`, or -1 when it does not say.
int64_t engine_index(cudnnBackendDescriptor_t config) {
    cudnnBackendDescriptor_t engine = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) !=
        CUDNN_STATUS_SUCCESS)
        return -1;
    int64_t count = 0, index = -1;
    if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &count, &engine) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                 &count, &index) != CUDNN_STATUS_SUCCESS)
        index = -1;
    cudnnBackendDestroyDescriptor(engine);
    return index;
}

struct HeuristicMode {
    cudnnBackendHeurMode_t mode;
    const char* name;
};
constexpr HeuristicMode kHeuristicModes[] = {{CUDNN_HEUR_MODE_A, "heuristic mode A"},
                                             {CUDNN_HEUR_MODE_B, "heuristic mode B"},
                                             {CUDNN_HEUR_MODE_FALLBACK, "the fallback list"}};

}  // namespace

CudnnGraph::~CudnnGraph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    for (auto& [id, t] : tensors_)
        if (t.descriptor) cudnnBackendDestroyDescriptor(t.descriptor);
}

int64_t CudnnGraph::add(Tensor t) {
    const int64_t id = next_id_++;
    tensors_.emplace(id, t);
    order_.push_back(id);
    return id;
}

int64_t CudnnGraph::tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return add({dims, strides, type, false, false, false, 0.0f});
}

int64_t CudnnGraph::virtual_tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return add({dims, strides, type, true, false, false, 0.0f});
}

int64_t CudnnGraph::workspace_tensor(const Dims& dims, const Dims& strides) {
    Tensor t{dims, strides, CUDNN_DATA_FLOAT, false, false, true, 0.0f};
    int64_t elements = 1;
    for (int i = 0; i < 4; ++i) elements += (dims[i] - 1) * strides[i];
    t.workspace_offset = intermediates_bytes_;
    intermediates_bytes_ +=
        (static_cast<std::size_t>(elements) * sizeof(float) + kWorkspaceAlignment - 1) /
        kWorkspaceAlignment * kWorkspaceAlignment;
    return add(t);
}

int64_t CudnnGraph::scalar(float value) {
    return add({{1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true, false, value});
}

void CudnnGraph::pointwise(cudnnPointwiseMode_t mode, int64_t y, int64_t x, int64_t b, int64_t t,
                           cudnnDataType_t math, int64_t axis) {
    ops_.push_back({OpKind::pointwise, static_cast<int>(mode), y, x, b, t, math, axis});
}

void CudnnGraph::reduction(cudnnReduceTensorOp_t op, int64_t y, int64_t x) {
    ops_.push_back({OpKind::reduction, static_cast<int>(op), y, x, -1, -1, CUDNN_DATA_FLOAT, -1});
}

void CudnnGraph::matmul(int64_t c, int64_t a, int64_t b) {
    ops_.push_back({OpKind::matmul, 0, c, a, b, -1, CUDNN_DATA_FLOAT, -1});
}

void CudnnGraph::reshape(int64_t y, int64_t x) {
    ops_.push_back({OpKind::reshape, 0, y, x, -1, -1, CUDNN_DATA_FLOAT, -1});
}

void CudnnGraph::causal_band_mask(int64_t y, int64_t x, int64_t fill) {
    ops_.push_back({OpKind::band_mask, 0, y, x, fill, -1, CUDNN_DATA_FLOAT, -1});
}

bool CudnnGraph::finalize_descriptors(std::string& why) {
    Steps step{why};
    for (int64_t id : order_) {
        Tensor& t = tensors_.at(id);
        if (!finalize_tensor(step, t.descriptor, id, t.dims, t.strides, t.type, t.is_virtual,
                             t.by_value))
            return false;
    }
    const auto desc = [&](int64_t id) { return id >= 0 ? tensors_.at(id).descriptor : nullptr; };
    Descriptors operations;
    for (const Op& op : ops_) {
        cudnnBackendDescriptor_t operation = nullptr;
        switch (op.kind) {
            case OpKind::pointwise:
                operation = pointwise_operation(
                    step, owned_, static_cast<cudnnPointwiseMode_t>(op.mode), op.math, op.axis,
                    desc(op.x), desc(op.b), desc(op.t), desc(op.y));
                break;
            case OpKind::reduction:
                operation =
                    reduction_operation(step, owned_, static_cast<cudnnReduceTensorOp_t>(op.mode),
                                        op.math, desc(op.x), desc(op.y));
                break;
            case OpKind::matmul:
                operation =
                    matmul_operation(step, owned_, op.math, desc(op.x), desc(op.b), desc(op.y));
                break;
            case OpKind::reshape:
                operation = reshape_operation(step, desc(op.x), desc(op.y));
                break;
            case OpKind::band_mask:
                operation = band_mask_operation(step, desc(op.x), desc(op.b), desc(op.y));
                break;
        }
        if (operation) owned_.push_back(operation);
        if (!step(operation ? cudnnBackendFinalize(operation) : CUDNN_STATUS_BAD_PARAM,
                  "operation finalize"))
            return false;
        operations.push_back(operation);
    }
    const cudnnBackendDescriptor_t graph = operation_graph(step, handle_, operations, owned_);
    if (!graph) return false;
    return choose_plan(graph, why);
}

// The first engine configuration whose plan finalises, of heuristic mode A's list, then mode
// B's, then the fallback list; `why` keeps every mode's last failure.
bool CudnnGraph::choose_plan(cudnnBackendDescriptor_t graph, std::string& why) {
    std::string failures;
    for (const HeuristicMode& heuristic : kHeuristicModes) {
        std::string failure = "no engine configuration";
        Steps step{failure};
        Descriptors configs;
        if (engine_configs(step, graph, heuristic.mode, owned_, configs)) {
            for (std::size_t i = 0; i < configs.size(); ++i) {
                int64_t workspace = 0;
                const cudnnBackendDescriptor_t plan =
                    plan_of(handle_, configs[i], workspace, failure);
                if (!plan) continue;
                plan_ = plan;
                owned_.push_back(plan);
                plan_workspace_ = (static_cast<std::size_t>(workspace) + kWorkspaceAlignment - 1) /
                                  kWorkspaceAlignment * kWorkspaceAlignment;
                engine_ = "engine " + std::to_string(engine_index(configs[i])) + " (" +
                          heuristic.name + ", configuration " + std::to_string(i + 1) + " of " +
                          std::to_string(configs.size()) + ")";
                return true;
            }
        }
        failures += (failures.empty() ? "" : "; ") + std::string(heuristic.name) + ": " + failure;
    }
    why = failures;
    return false;
}

bool CudnnGraph::build(std::string& why) {
    if (plan_) return true;
    return finalize_descriptors(why);
}

bool CudnnGraph::run(const std::unordered_map<int64_t, void*>& pointers, void* workspace,
                     cudaStream_t stream, std::string& why) {
    if (!plan_) throw Error("internal: running a cuDNN graph that was not built");
    std::vector<int64_t> ids;
    std::vector<void*> data;
    for (auto& [id, t] : tensors_) {
        if (t.is_virtual) continue;
        ids.push_back(id);
        if (t.by_value) {
            data.push_back(&t.value);
        } else if (t.in_workspace) {
            data.push_back(static_cast<char*>(workspace) + plan_workspace_ + t.workspace_offset);
        } else {
            const auto it = pointers.find(id);
            if (it == pointers.end()) throw Error("internal: a cuDNN graph tensor without memory");
            data.push_back(it->second);
        }
    }
    if (intermediates_bytes_ > 0) {
        // Intermediates that the engines accumulate into start from zero (cuDNN before 9.6
        // assumed the caller cleared them; later ones do it themselves). A small memset.
        TRIDENT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(workspace) + plan_workspace_, 0,
                                           intermediates_bytes_, stream));
    }
    Steps step{why};
    cudnnBackendDescriptor_t pack = nullptr;
    if (!step(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack),
              "variant pack"))
        return false;
    const int64_t count = static_cast<int64_t>(ids.size());
    step(set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, ids.data()),
         "variant pack ids");
    step(set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, data.data()),
         "variant pack pointers");
    step(set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
         "variant pack workspace");
    step(cudnnBackendFinalize(pack), "variant pack finalize");
    step(cudnnSetStream(handle_, stream), "cudnnSetStream");
    if (step.ok) step(cudnnBackendExecute(handle_, plan_, pack), "cudnnBackendExecute");
    cudnnBackendDestroyDescriptor(pack);
    // A launch that failed leaves its error to the next CUDA call, which would throw there.
    if (!step.ok) cudaGetLastError();
    return step.ok;
}

}  // namespace trident::kernels::cuda
