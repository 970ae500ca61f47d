#include "runtime/nccl_lib.h"

#include <dlfcn.h>

#include <filesystem>
#include <type_traits>

#include "runtime/error.h"

#ifdef CNN_HAVE_NCCL_HEADER
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == sizeof(cnn::NcclUniqueId), "ncclUniqueId size");
static_assert(int(ncclFloat32) == int(cnn::kNcclFloat32) && int(ncclInt32) == int(cnn::kNcclInt32),
              "ncclDataType_t");
static_assert(int(ncclSum) == int(cnn::kNcclSum) && int(ncclMax) == int(cnn::kNcclMax),
              "ncclRedOp_t");
static_assert(int(ncclSuccess) == cnn::kNcclSuccess && int(ncclInProgress) == cnn::kNcclInProgress,
              "ncclResult_t");
#endif

namespace cnn {

// The signatures of nccl.h (ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums: int).
struct NcclLib::Api {
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  int (*comm_get_async_error)(NcclComm, int*) = nullptr;
  int (*comm_abort)(NcclComm) = nullptr;
  int (*comm_destroy)(NcclComm) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
};

std::string nccl_library_path(const std::string& env_value, const std::string& config_value) {
  std::string p = !env_value.empty() ? env_value : config_value;
  if (p.empty()) return "libnccl.so.2";
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p += "/libnccl.so.2";
  return p;
}

NcclLib::NcclLib(const std::string& path, const std::string& origin) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    CNN_FAIL(
        "cannot load the NCCL library '{}' ({}): {}; multi-GPU training needs libnccl.so.2: "
        "set CNN_NCCL_LIBRARY or training.nccl_library to its path (a file or its folder, e.g. "
        "<python>/site-packages/nvidia/nccl/lib of a PyTorch install)",
        path, origin, why ? why : "unknown dlopen error");
  }
  api_ = new Api;
  const auto resolve = [&](auto& fn, const char* name) {
    void* sym = dlsym(handle_, name);
    if (!sym) {
      dlclose(handle_);
      handle_ = nullptr;
      delete api_;
      api_ = nullptr;
      CNN_FAIL("'{}' ({}) is not a usable NCCL library: it has no {}", path, origin, name);
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  resolve(api_->get_version, "ncclGetVersion");
  resolve(api_->get_unique_id, "ncclGetUniqueId");
  resolve(api_->comm_init_rank, "ncclCommInitRank");
  resolve(api_->all_reduce, "ncclAllReduce");
  resolve(api_->comm_get_async_error, "ncclCommGetAsyncError");
  resolve(api_->comm_abort, "ncclCommAbort");
  resolve(api_->comm_destroy, "ncclCommDestroy");
  resolve(api_->get_error_string, "ncclGetErrorString");
  check(api_->get_version(&version_), "ncclGetVersion");
}

NcclLib::~NcclLib() {
  // The library stays mapped: NCCL's own threads may outlive a communicator by a little.
  delete api_;
}

std::string NcclLib::version_string() const {
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", version_ / 10000, version_ / 100 % 100, version_ % 100);
}

std::string NcclLib::error_string(int result) const {
  const char* s = api_->get_error_string(result);
  return s ? s : fmt::format("NCCL error {}", result);
}

void NcclLib::check(int result, const char* call) const {
  CNN_CHECK(result == kNcclSuccess, "{} failed: {} (NCCL {}, {})", call, error_string(result),
            version_string(), path_);
}

NcclUniqueId NcclLib::get_unique_id() const {
  NcclUniqueId id{};
  check(api_->get_unique_id(&id), "ncclGetUniqueId");
  return id;
}

NcclComm NcclLib::init_rank(int nranks, const NcclUniqueId& id, int rank) const {
  NcclComm comm = nullptr;
  check(api_->comm_init_rank(&comm, nranks, id, rank), "ncclCommInitRank");
  return comm;
}

void NcclLib::all_reduce(const void* send, void* recv, size_t count, NcclDataType type,
                         NcclRedOp op, NcclComm comm, cudaStream_t stream) const {
  check(api_->all_reduce(send, recv, count, type, op, comm, stream), "ncclAllReduce");
}

int NcclLib::async_error(NcclComm comm) const {
  int r = kNcclSuccess;
  const int q = api_->comm_get_async_error(comm, &r);
  return q != kNcclSuccess ? q : r;
}

void NcclLib::abort(NcclComm comm) const {
  if (comm) (void)api_->comm_abort(comm);
}

void NcclLib::destroy(NcclComm comm) const {
  if (comm) (void)api_->comm_destroy(comm);
}

}  // namespace cnn
