#pragma once
// Programmatic dependent launch for a captured graph: a kernel -> kernel edge made programmatic
// lets the downstream kernel launch before the upstream one has completed, its blocks waiting in
// ptx::griddep_enter (the first statement of every kernel of the project) for the upstream
// grid's completion and writes, so that the gap between two dependent kernels (launch and block
// scheduling) is hidden. Only edges into the project's own kernels (namespace cnn) change: a
// library kernel (cuDNN in the bench) does not wait, and must keep its full dependency. Only
// edges of a chain change: a fork onto a side stream and its join keep full edges.
//   AtExit:  the downstream kernel launches once every block of the upstream one has exited (the
//            edge's programmatic port; our kernels do not signal earlier): it overlaps the
//            upstream grid's completion, never its work.
//   AtStart: once every block of the upstream one has begun (the launch-completion port): its
//            blocks may share SMs with the upstream's last wave while they wait.
#include <string>

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cnn {

enum class GraphOverlap { Off, AtExit, AtStart };

struct GraphOverlapResult {
  int programmatic_edges = 0;  // kernel -> kernel edges the instantiated graph overlaps
  std::string note;            // why none were made where overlap was asked for; "" otherwise
};

#ifdef CNN_HAVE_CUDA
// Instantiates `graph` into *exec. overlap other than Off: on a device of compute capability 9.0
// or later, instantiate a copy of it whose kernel -> kernel edges into the project's kernels are
// programmatic; if that copy cannot be made or instantiated, the graph as captured is (the
// reason lands in the result's note). Returns the error of the last instantiation tried
// (cudaSuccess when *exec was made); `graph` itself is never changed.
cudaError_t instantiate_graph(cudaGraphExec_t* exec, cudaGraph_t graph, GraphOverlap overlap,
                              GraphOverlapResult* result);
#endif

// Whether a kernel's (mangled or demangled) name is one of the project's, i.e. in namespace cnn.
bool is_project_kernel_name(const std::string& name);

}  // namespace cnn
