#pragma once
// NCCL loaded at run time with dlopen: the build never needs NCCL, and a machine without it fails
// only when a multi-GPU run asks for it, with one line naming the library it tried. Only the few
// entry points the data-parallel trainer uses are resolved; their types are declared here with
// NCCL's documented ABI values (checked against nccl.h in nccl_lib.cpp where the header exists).
#include <cstddef>
#include <string>

#include "runtime/stream.h"

namespace cnn {

struct NcclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;  // ncclComm_t

enum NcclDataType { kNcclInt32 = 2, kNcclFloat32 = 7 };
enum NcclRedOp { kNcclSum = 0, kNcclMax = 2 };
constexpr int kNcclSuccess = 0, kNcclInProgress = 7;

// Where the library is looked for: CNN_NCCL_LIBRARY (environment) over training.nccl_library
// (config) over "libnccl.so.2" (the loader's search path). A folder stands for libnccl.so.2 in
// it, e.g. <site-packages>/nvidia/nccl/lib of a PyTorch install.
std::string nccl_library_path(const std::string& env_value, const std::string& config_value);

class NcclLib {
 public:
  // Loads `path` and resolves the entry points; throws cnn::Error naming the path, where it came
  // from (`origin`) and the loader's message.
  NcclLib(const std::string& path, const std::string& origin);
  ~NcclLib();
  NcclLib(const NcclLib&) = delete;
  NcclLib& operator=(const NcclLib&) = delete;

  int version() const { return version_; }  // e.g. 22809 for 2.28.9
  const std::string& path() const { return path_; }
  // "2.28.9"
  std::string version_string() const;

  // Each call throws on a result other than success, naming the call and NCCL's message.
  NcclUniqueId get_unique_id() const;
  NcclComm init_rank(int nranks, const NcclUniqueId& id, int rank) const;
  void all_reduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                  NcclComm comm, cudaStream_t stream) const;
  // The communicator's asynchronous error (kNcclSuccess while healthy).
  int async_error(NcclComm comm) const;
  void abort(NcclComm comm) const;    // never throws: used on the way out of a failure
  void destroy(NcclComm comm) const;  // never throws
  std::string error_string(int result) const;

 private:
  void check(int result, const char* call) const;

  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  struct Api;
  Api* api_ = nullptr;
};

}  // namespace cnn
