#include "app/train/distributed.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "layers/network.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"

#if defined(CNN_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#include "runtime/side_stream.h"
#endif

namespace cnn {

namespace {

int env_int(const char* (*getenv_fn)(const char*), const char* name, int lo, int hi,
            const char* what) {
  const char* v = getenv_fn(name);
  CNN_CHECK(v && *v, "{} is not set, but it is needed with the other rank variables ({})", name,
            what);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  CNN_CHECK(end != v && *end == '\0' && x >= lo && x <= hi,
            "{}='{}': expected {}, an integer from {} to {}", name, v, what, lo, hi);
  return int(x);
}

const char* first_set(const char* (*getenv_fn)(const char*),
                      std::initializer_list<const char*> names, const char** which = nullptr) {
  for (const char* n : names)
    if (const char* v = getenv_fn(n); v && *v) {
      if (which) *which = n;
      return v;
    }
  return nullptr;
}

constexpr const char* kIdMagic = "cnn-nccl-id";

}  // namespace

RankInfo rank_info_from_env(const char* (*getenv_fn)(const char*)) {
  RankInfo r;
  const char* rank_var = nullptr;
  if (first_set(getenv_fn, {"CNN_RANK"})) {
    r.world = env_int(getenv_fn, "CNN_WORLD_SIZE", 1, 1024, "the number of ranks");
    r.rank = env_int(getenv_fn, "CNN_RANK", 0, r.world - 1, "this process's rank");
    r.local_rank = getenv_fn("CNN_LOCAL_RANK")
                       ? env_int(getenv_fn, "CNN_LOCAL_RANK", 0, 1023, "this rank's GPU")
                       : r.rank;
    const char* f = getenv_fn("CNN_NCCL_ID_FILE");
    CNN_CHECK(f && *f, "CNN_RANK is set but CNN_NCCL_ID_FILE is not (train --gpus N sets both)");
    r.id_file = f;
    if (const char* t = getenv_fn("CNN_NCCL_ID_TOKEN")) r.id_token = t;
    r.source = "train --gpus";
    return r;
  }
  if (first_set(getenv_fn, {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}, &rank_var)) {
    const bool ompi = std::string(rank_var) == "OMPI_COMM_WORLD_RANK";
    r.world = env_int(getenv_fn, ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", 1, 1024,
                      "the number of ranks");
    r.rank = env_int(getenv_fn, rank_var, 0, r.world - 1, "this process's rank");
    const char* local_var = nullptr;
    r.local_rank =
        first_set(getenv_fn, {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"},
                  &local_var)
            ? env_int(getenv_fn, local_var, 0, 1023, "this rank's GPU on its machine")
            : r.rank;
    if (const char* f = getenv_fn("CNN_NCCL_ID_FILE")) r.id_file = f;
    if (const char* t = first_set(
            getenv_fn, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "SLURM_JOB_ID"}))
      r.id_token = t;
    r.source = fmt::format("mpirun ({})", rank_var);
  }
  return r;
}

void write_nccl_id_file(const std::string& path, const NcclUniqueId& id, const std::string& token) {
  std::string text = std::string(kIdMagic) + " " + token + "\n";
  static const char* kHex = "0123456789abcdef";
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  text += "\n";
  write_file_atomically(path, [&](std::FILE* f) {
    // The id lets whoever reads it join the communicator: readable by this user only.
    CNN_CHECK(fchmod(fileno(f), 0600) == 0, "cannot make '{}' private (chmod 0600)", path);
    write_bytes_checked(f, text.data(), text.size());
  });
}

NcclUniqueId wait_nccl_id_file(const std::string& path, const std::string& token,
                               double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  const std::string want = std::string(kIdMagic) + " " + token + "\n";
  std::string why = "it does not exist";
  for (;;) {
    if (access(path.c_str(), R_OK) == 0) {
      const std::vector<uint8_t> bytes = read_file(path, {4096, "NCCL id file"});
      const std::string text(bytes.begin(), bytes.end());
      if (text.compare(0, want.size(), want) != 0) {
        why = "it is from another job (its first line is not '" + want.substr(0, want.size() - 1) +
              "')";
      } else if (text.size() < want.size() + 2 * sizeof(NcclUniqueId)) {
        why = "it is too short";
      } else {
        NcclUniqueId id{};
        const auto nib = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        };
        bool ok = true;
        for (size_t i = 0; i < sizeof(id.internal) && ok; ++i) {
          const int hi = nib(text[want.size() + 2 * i]), lo = nib(text[want.size() + 2 * i + 1]);
          ok = hi >= 0 && lo >= 0;
          id.internal[i] = static_cast<char>(hi * 16 + lo);
        }
        if (ok) return id;
        why = "it holds something other than hex digits";
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CNN_CHECK(waited < timeout_s,
              "waited {:.0f} s for rank 0's NCCL id in '{}' but {} (did rank 0 start? with "
              "mpirun, the file must be on a folder all ranks share)",
              waited, path, why);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::unique_ptr<NcclLib> open_nccl(const std::string& config_value) {
  const char* env_lib = std::getenv("CNN_NCCL_LIBRARY");
  const bool from_env = env_lib && *env_lib;
  return std::make_unique<NcclLib>(nccl_library_path(from_env ? env_lib : "", config_value),
                                   from_env                ? "from CNN_NCCL_LIBRARY"
                                   : !config_value.empty() ? "from training.nccl_library"
                                                           : "the default name");
}

std::string multi_gpu_unsupported_reason() {
#if defined(CNN_HAVE_CUDA) && defined(CNN_HAVE_NCCL)
  return "";
#elif defined(CNN_HAVE_CUDA)
  return "this build has multi-GPU training off (configured with CNN_ENABLE_NCCL=OFF or without "
         "nccl.h)";
#else
  return "this build has no CUDA";
#endif
}

std::vector<GradBucket> plan_grad_buckets(const std::vector<int64_t>& ready_offsets, int64_t total,
                                          int64_t bucket_floats) {
  CNN_CHECK(bucket_floats > 0, "gradient buckets of {} floats", bucket_floats);
  std::vector<GradBucket> out;
  int64_t end = total;
  for (const int64_t off : ready_offsets) {
    CNN_CHECK(off >= 0 && off <= end, "gradient offsets must fall from {} to 0 (got {} after {})",
              total, off, end);
    if (end - off >= bucket_floats) {
      out.push_back({off, end});
      end = off;
    }
  }
  if (end > 0) out.push_back({0, end});
  return out;
}

#if defined(CNN_HAVE_CUDA) && defined(CNN_HAVE_NCCL)

namespace {
cudaEvent_t ev(void* p) {
  return static_cast<cudaEvent_t>(p);
}
void* new_event(bool timing) {
  cudaEvent_t e = nullptr;
  CNN_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}
}  // namespace

DataParallel::DataParallel(const RankInfo& info, const std::string& nccl_library_config,
                           bool deterministic, double timeout_s)
    : info_(info), timeout_s_(timeout_s), deterministic_(deterministic) {
  lib_ = open_nccl(nccl_library_config);
  if (deterministic) {
    // A fixed algorithm and protocol: the same reduction order on every run with this many ranks.
    setenv("NCCL_ALGO", "Ring", 1);
    setenv("NCCL_PROTO", "Simple", 1);
  }
  int devices = 0;
  CNN_CUDA_CHECK(cudaGetDeviceCount(&devices));
  CNN_CHECK(info_.local_rank < devices,
            "rank {} wants GPU {} (its local rank) but this machine shows {} GPU(s)", info_.rank,
            info_.local_rank, devices);
  CNN_CUDA_CHECK(cudaSetDevice(info_.local_rank));
  CNN_CHECK(!info_.id_file.empty(), "rank {}: no file to exchange the NCCL id through", info_.rank);
  NcclUniqueId id{};
  if (info_.rank == 0) {
    id = lib_->get_unique_id();
    write_nccl_id_file(info_.id_file, id, info_.id_token);
  } else {
    id = wait_nccl_id_file(info_.id_file, info_.id_token, timeout_s_);
  }
  comm_ = lib_->init_rank(info_.world, id, info_.rank);
}

DataParallel::~DataParallel() {
  if (comm_) {
    if (failed_)
      lib_->abort(comm_);
    else
      lib_->destroy(comm_);
  }
  for (void* e : ready_events_) cudaEventDestroy(ev(e));
  for (void* e : {ev_first_, ev_backward_end_, ev_comm_end_, step_events_[0], step_events_[1]})
    if (e) cudaEventDestroy(ev(e));
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
}

std::string DataParallel::describe() const {
  return fmt::format(
      "rank {} of {} ({}), GPU {}; NCCL {} from {}{}; gradients summed in buckets on their own "
      "stream while backward runs",
      info_.rank, info_.world, info_.source, info_.local_rank, lib_->version_string(), lib_->path(),
      deterministic_ ? "; deterministic: NCCL_ALGO=Ring NCCL_PROTO=Simple" : "");
}

void DataParallel::attach(Network& net, const Exec& ex, int64_t bucket_bytes) {
  ex_ = ex;
  d_grads_ = net.grads();
  buckets_ = plan_grad_buckets(net.grads_ready_offsets(), net.num_params(),
                               std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float))));
  launched_.assign(buckets_.size(), false);
  // Non-blocking: the communication must not wait for the legacy stream's copies. The priority
  // of the training stream, as the compute it overlaps.
  CNN_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking,
                                              greatest_stream_priority()));
  for (size_t b = 0; b < buckets_.size(); ++b) ready_events_.push_back(new_event(false));
  ev_first_ = new_event(true);
  ev_backward_end_ = new_event(true);
  ev_comm_end_ = new_event(true);
  step_events_[0] = new_event(false);
  step_events_[1] = new_event(false);
  net.set_grads_ready_hook([this](int64_t final_from) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!launched_[b] && buckets_[b].begin >= final_from) launch_bucket(b);
  });
}

void DataParallel::launch_bucket(size_t b) {
  CNN_CUDA_CHECK(cudaEventRecord(ev(ready_events_[b]), ex_.stream));
  CNN_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ev(ready_events_[b]), 0));
  if (b == 0) CNN_CUDA_CHECK(cudaEventRecord(ev(ev_first_), comm_stream_));
  float* p = d_grads_ + buckets_[b].begin;
  lib_->all_reduce(p, p, size_t(buckets_[b].end - buckets_[b].begin), kNcclFloat32, kNcclSum, comm_,
                   comm_stream_);
  launched_[b] = true;
}

void DataParallel::finish_step() {
  CNN_CUDA_CHECK(cudaEventRecord(ev(ev_backward_end_), ex_.stream));
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!launched_[b]) launch_bucket(b);
  CNN_CUDA_CHECK(cudaEventRecord(ev(ev_comm_end_), comm_stream_));
  CNN_CUDA_CHECK(cudaStreamWaitEvent(ex_.stream, ev(ev_comm_end_), 0));
  launched_.assign(buckets_.size(), false);
}

void DataParallel::all_reduce_sum(float* d_data, size_t count) {
  lib_->all_reduce(d_data, d_data, count, kNcclFloat32, kNcclSum, comm_, ex_.stream);
}

void DataParallel::wait_event(void* event, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    const cudaError_t q = cudaEventQuery(ev(event));
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CNN_CUDA_CHECK(q);
    const int nccl = lib_->async_error(comm_);
    if (nccl != kNcclSuccess && nccl != kNcclInProgress) {
      abort_comm();
      CNN_FAIL(
          "rank {}: NCCL reports '{}' while waiting for {} (another rank died or the "
          "network failed)",
          info_.rank, lib_->error_string(nccl), what);
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      abort_comm();
      CNN_FAIL(
          "rank {}: {} did not finish in {:.0f} s (CNN_NCCL_TIMEOUT_S); another rank "
          "stopped or hangs — aborting the communicator",
          info_.rank, what, waited);
    }
    // Spin briefly (a step is often shorter than a sleep), then yield the core.
    if (spin > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void DataParallel::abort_comm() {
  // Aborting ends the kernels of collectives that will never complete, so that the stream
  // synchronizations on the way out (the trainer's destructors) return.
  lib_->abort(comm_);
  comm_ = nullptr;
  failed_ = true;
}

void DataParallel::drain() {
  CNN_CUDA_CHECK(cudaEventRecord(ev(step_events_[steps_ % 2]), ex_.stream));
  wait_event(step_events_[steps_ % 2], "this step's all-reduce");
}

void DataParallel::watch_step() {
  void* mine = step_events_[steps_ % 2];
  CNN_CUDA_CHECK(cudaEventRecord(ev(mine), ex_.stream));
  if (steps_ > 0) wait_event(step_events_[(steps_ + 1) % 2], "the previous step's all-reduce");
  ++steps_;
}

CommTimes DataParallel::last_times() const {
  CommTimes t;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, ev(ev_first_), ev(ev_comm_end_)) == cudaSuccess)
    t.allreduce_ms = ms;
  else
    (void)cudaGetLastError();
  if (cudaEventElapsedTime(&ms, ev(ev_backward_end_), ev(ev_comm_end_)) == cudaSuccess)
    t.exposed_ms = std::max(0.0f, ms);
  else
    (void)cudaGetLastError();
  return t;
}

#else

DataParallel::DataParallel(const RankInfo& info, const std::string&, bool, double) : info_(info) {
  CNN_FAIL(
      "rank {} of {} ({}): this build has no multi-GPU support (it needs CUDA and "
      "CNN_ENABLE_NCCL=ON at configure time)",
      info.rank, info.world, info.source);
}
DataParallel::~DataParallel() = default;
std::string DataParallel::describe() const {
  return "";
}
void DataParallel::attach(Network&, const Exec&, int64_t) {}
void DataParallel::finish_step() {}
void DataParallel::all_reduce_sum(float*, size_t) {}
void DataParallel::watch_step() {}
void DataParallel::drain() {}
void DataParallel::abort_comm() {}
CommTimes DataParallel::last_times() const {
  return {};
}
void DataParallel::launch_bucket(size_t) {}
void DataParallel::wait_event(void*, const char*) {}

#endif

}  // namespace cnn
