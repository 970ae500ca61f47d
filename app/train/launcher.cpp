#include "app/train/launcher.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "runtime/error.h"

namespace cnn {

namespace {

volatile std::sig_atomic_t g_launcher_signal = 0;
extern "C" void on_launcher_signal(int sig) {
  g_launcher_signal = sig;
}

// The launcher's own SIGINT/SIGTERM handling while it waits, restored afterwards.
class LauncherSignals {
 public:
  LauncherSignals() {
    g_launcher_signal = 0;
    prev_int_ = std::signal(SIGINT, on_launcher_signal);
    prev_term_ = std::signal(SIGTERM, on_launcher_signal);
  }
  ~LauncherSignals() {
    std::signal(SIGINT, prev_int_ == SIG_ERR ? SIG_DFL : prev_int_);
    std::signal(SIGTERM, prev_term_ == SIG_ERR ? SIG_DFL : prev_term_);
  }
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;

 private:
  void (*prev_int_)(int) = SIG_DFL;
  void (*prev_term_)(int) = SIG_DFL;
};

// A private folder for the NCCL id file, removed when the run ends.
class IdFolder {
 public:
  IdFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/cnn-train-XXXXXX";
    CNN_CHECK(mkdtemp(tmpl.data()) != nullptr,
              "cannot create a folder like '{}' for the NCCL id: {}", tmpl, std::strerror(errno));
    dir_ = tmpl;
  }
  ~IdFolder() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace

std::string RankExit::describe() const {
  if (exited) return fmt::format("exited with status {}", code);
  const char* name = strsignal(signal);
  return fmt::format("was killed by signal {} ({})", signal, name ? name : "?");
}

LaunchResult launch_ranks(const LaunchRequest& req) {
  CNN_CHECK(req.world >= 1, "launch: {} ranks", req.world);
  const IdFolder ids;
  const LauncherSignals signals;
  const std::string token = std::to_string(getpid());
  std::vector<int> pids;
  std::vector<std::vector<char>> arg_storage;
  for (const std::string& a : req.argv) arg_storage.emplace_back(a.begin(), a.end() + 0);
  std::vector<char*> argv;
  for (auto& a : arg_storage) {
    a.push_back('\0');
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);

  LaunchResult res;
  const auto stop_all = [&](int sig) {
    for (size_t r = 0; r < pids.size(); ++r)
      if (pids[r] > 0) kill(pids[r], sig);
  };
  // SIGINT and SIGTERM stay blocked across each fork: a child must not run the launcher's
  // handler, which would swallow a stop sent before the child resets its dispositions. The
  // child resets them first and only then unblocks them, so an early stop is held until then
  // and kills it.
  sigset_t stops, before;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  for (int r = 0; r < req.world; ++r) {
    pthread_sigmask(SIG_BLOCK, &stops, &before);  // this thread's mask, which the child inherits
    const pid_t pid = fork();
    if (pid != 0) pthread_sigmask(SIG_SETMASK, &before, nullptr);
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      stop_all(SIGKILL);
      for (int p : pids) waitpid(p, nullptr, 0);
      CNN_FAIL("cannot start rank {} of {}: fork failed: {}", r, req.world, why);
    }
    if (pid == 0) {
      // The child: only async-signal-safe work before exec, plus setenv (single-threaded here).
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      sigprocmask(SIG_UNBLOCK, &stops, nullptr);
      setenv("CNN_RANK", std::to_string(r).c_str(), 1);
      setenv("CNN_WORLD_SIZE", std::to_string(req.world).c_str(), 1);
      setenv("CNN_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("CNN_NCCL_ID_FILE", (ids.dir() + "/nccl-id").c_str(), 1);
      setenv("CNN_NCCL_ID_TOKEN", token.c_str(), 1);
      execv(req.exe.c_str(), argv.data());
      const std::string msg = fmt::format("error: cannot start rank {}: exec '{}': {}\n", r,
                                          req.exe, std::strerror(errno));
      (void)!write(2, msg.data(), msg.size());
      _exit(127);
    }
    pids.push_back(pid);
    res.ranks.push_back(RankExit{r, pid});
  }

  int running = req.world, forwarded = 0;
  int first_failure = -1;
  std::chrono::steady_clock::time_point term_sent{};
  bool killed = false;
  while (running > 0) {
    if (g_launcher_signal && !forwarded) {
      // Rank 0 saves the checkpoint and stops; the others follow once it has.
      forwarded = int(g_launcher_signal);
      if (pids[0] > 0) kill(pids[0], forwarded);
    }
    bool reaped = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      const pid_t pid = waitpid(pids[r], &status, WNOHANG);
      if (pid == 0 || (pid < 0 && errno == EINTR)) continue;
      reaped = true;
      pids[r] = 0;
      --running;
      RankExit& e = res.ranks[r];
      if (pid < 0) {  // cannot happen for our own child; counted as a failure all the same
        e.exited = true;
        e.code = 127;
      } else {
        e.exited = WIFEXITED(status);
        e.code = e.exited ? WEXITSTATUS(status) : 0;
        e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      if ((!e.exited || e.code != 0) && first_failure < 0) {
        first_failure = int(r);
        term_sent = std::chrono::steady_clock::now();
        stop_all(SIGTERM);
      }
    }
    if (reaped) continue;
    if (first_failure >= 0 && !killed &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - term_sent).count() >
            req.grace_s) {
      killed = true;
      stop_all(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  if (first_failure < 0) return res;
  const RankExit& f = res.ranks[size_t(first_failure)];
  res.exit_code = f.exited ? f.code : 128 + f.signal;
  if (forwarded && first_failure == 0 && f.exited && f.code == 128 + forwarded) {
    res.message = fmt::format(
        "stopped by signal {} (rank 0 wrote the checkpoint; the other "
        "ranks were stopped)",
        forwarded);
    return res;
  }
  std::string others;
  for (const RankExit& e : res.ranks)
    if (e.rank != first_failure)
      others += fmt::format("{}rank {} {}", others.empty() ? "" : ", ", e.rank, e.describe());
  res.message = fmt::format("rank {} (pid {}) {}; the other ranks were stopped with SIGTERM{}{}",
                            f.rank, f.pid, f.describe(), killed ? " and then SIGKILL" : "",
                            others.empty() ? "" : " (" + others + ")");
  return res;
}

}  // namespace cnn
