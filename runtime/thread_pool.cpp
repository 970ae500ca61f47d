#include "runtime/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/env_switches.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// True on a pool worker, and on a caller while its job runs: a nested parallel call then runs
// inline instead of waiting for workers that are busy with the outer job (which would deadlock).
thread_local bool t_in_parallel = false;

int threads_from_env() {
  if (const int n = process_env_switches().cpu_threads; n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(static_cast<int>(hw == 0 ? 1 : hw), 1, kMaxDefaultCpuThreads);
}

// One process-wide pool, created on first use. This is acceptable next to the "no mutable
// globals" rule because callers can observe no state in it: every job hands in its own inputs and
// outputs, the pool only lends threads, and results do not depend on which thread runs which
// task. Jobs from different caller threads are serialized by submit_mutex_.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  void run(int64_t tasks, const std::function<void(int64_t)>& fn) {
    if (tasks <= 0) return;
    if (tasks == 1 || threads_ == 1 || t_in_parallel) {
      // Inline, with the same contract as the pooled path: every task runs, the first error is
      // rethrown at the end.
      std::exception_ptr error;
      for (int64_t t = 0; t < tasks; ++t) {
        try {
          fn(t);
        } catch (...) {
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
      return;
    }
    std::lock_guard<std::mutex> submit(submit_mutex_);
    Job job;
    job.fn = &fn;
    job.tasks = tasks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    t_in_parallel = true;
    drain(job);
    t_in_parallel = false;
    {
      // The job lives on this stack frame: wait until no worker holds it any more.
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [&] { return job.done == job.tasks && job.holders == 0; });
      job_ = nullptr;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    const std::function<void(int64_t)>* fn = nullptr;
    int64_t tasks = 0;
    std::atomic<int64_t> next{0};
    int64_t done = 0;          // guarded by mutex_
    int holders = 0;           // workers inside drain(); guarded by mutex_
    std::exception_ptr error;  // guarded by mutex_
  };

  // Takes tasks of `job` until none is left, then counts the ones this thread finished.
  void drain(Job& job) {
    int64_t finished = 0;
    for (;;) {
      const int64_t t = job.next.fetch_add(1);
      if (t >= job.tasks) break;
      try {
        (*job.fn)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!job.error) job.error = std::current_exception();
      }
      ++finished;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    job.done += finished;
    if (job.done == job.tasks) finished_.notify_all();
  }

  void worker_loop() {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
        if (stop_) return;
        seen = generation_;
        job = job_;
        ++job->holders;
      }
      drain(*job);
      std::lock_guard<std::mutex> lock(mutex_);
      --job->holders;
      if (job->holders == 0) finished_.notify_all();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;         // guards job_, generation_, stop_ and the Job counters
  std::condition_variable wake_, finished_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

ThreadPool& pool() {
  static ThreadPool p(threads_from_env());
  return p;
}

}  // namespace

int cpu_thread_count() {
  return pool().threads();
}

void parallel_tasks(int64_t tasks, const std::function<void(int64_t)>& fn) {
  pool().run(tasks, fn);
}

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>(n, cpu_thread_count());
  parallel_tasks(chunks,
                 [&](int64_t t) { fn(begin + n * t / chunks, begin + n * (t + 1) / chunks); });
}

}  // namespace cnn
