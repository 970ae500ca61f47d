#include "runtime/graph_overlap.h"

#include <map>
#include <vector>

namespace cnn {

bool is_project_kernel_name(const std::string& name) {
  // Itanium mangling of a function in namespace cnn (also templates and anonymous namespaces
  // inside it); a demangled name starts with the namespace, or with the return type.
  for (const char* prefix : {"_ZN3cnn", "cnn::", "void cnn::"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

#ifdef CNN_HAVE_CUDA
namespace {

// Each kernel node runs at the priority of the stream it was captured from (the optimizer's
// early updates on a low-priority side stream), not at that of the stream the graph is launched
// into.
constexpr unsigned long long kInstantiateFlags = cudaGraphInstantiateFlagUseNodePriority;

bool is_project_kernel(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel)
    return false;
  cudaKernelNodeParams p{};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || !p.func ||
      cudaFuncGetName(&name, p.func) != cudaSuccess || !name) {
    (void)cudaGetLastError();
    return false;
  }
  return is_project_kernel_name(name);
}

// Makes the kernel -> project-kernel edges of `g` programmatic; returns how many, or -1 with
// *why set when the graph could not be read or changed. Only edges of a chain: a node with two
// dependents or two dependencies (a fork onto a side stream, its join) keeps full edges.
int make_edges_programmatic(cudaGraph_t g, GraphOverlap overlap, std::string* why) {
  size_t n = 0;
  cudaError_t err = cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (err == cudaSuccess && n > 0)
    err = cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n);
  std::map<cudaGraphNode_t, int> out_degree, in_degree;
  for (size_t i = 0; err == cudaSuccess && i < n; ++i) {
    ++out_degree[from[i]];
    ++in_degree[to[i]];
  }
  int made = 0;
  for (size_t i = 0; err == cudaSuccess && i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0) continue;
    if (out_degree[from[i]] > 1 || in_degree[to[i]] > 1) continue;
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(from[i], &type) != cudaSuccess || type != cudaGraphNodeTypeKernel ||
        !is_project_kernel(to[i]))
      continue;
    cudaGraphEdgeData programmatic{};
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    programmatic.from_port = overlap == GraphOverlap::AtStart
                                 ? cudaGraphKernelNodePortLaunchCompletion
                                 : cudaGraphKernelNodePortProgrammatic;
    err = cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1);
    if (err == cudaSuccess) err = cudaGraphAddDependencies(g, &from[i], &to[i], &programmatic, 1);
    if (err == cudaSuccess) ++made;
  }
  if (err != cudaSuccess) {
    *why = std::string("making the graph's kernel edges programmatic: ") + cudaGetErrorString(err);
    (void)cudaGetLastError();
    return -1;
  }
  return made;
}

bool device_has_programmatic_launch() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9;
}

}  // namespace

cudaError_t instantiate_graph(cudaGraphExec_t* exec, cudaGraph_t graph, GraphOverlap overlap,
                              GraphOverlapResult* result) {
  *result = GraphOverlapResult{};
  if (overlap != GraphOverlap::Off && !device_has_programmatic_launch()) {
    result->note = "no programmatic dependent launch before compute capability 9.0";
    overlap = GraphOverlap::Off;
  }
  if (overlap != GraphOverlap::Off) {
    cudaGraph_t copy = nullptr;
    cudaError_t err = cudaGraphClone(&copy, graph);
    std::string why;
    const int made = err == cudaSuccess ? make_edges_programmatic(copy, overlap, &why) : -1;
    if (err != cudaSuccess) why = std::string("cudaGraphClone: ") + cudaGetErrorString(err);
    if (made > 0) {
      err = cudaGraphInstantiate(exec, copy, kInstantiateFlags);
      if (err == cudaSuccess)
        result->programmatic_edges = made;
      else
        why =
            std::string("cudaGraphInstantiate with programmatic edges: ") + cudaGetErrorString(err);
    }
    if (copy) cudaGraphDestroy(copy);
    if (made > 0 && err == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();
    result->note = made == 0 ? "no kernel -> kernel edge into the project's kernels" : why;
  }
  // Node priorities matter only where the step forks onto a side stream: a driver that refuses
  // the flag still gets the graph.
  if (cudaGraphInstantiate(exec, graph, kInstantiateFlags) == cudaSuccess) return cudaSuccess;
  (void)cudaGetLastError();
  return cudaGraphInstantiate(exec, graph, 0);
}
#endif

}  // namespace cnn
