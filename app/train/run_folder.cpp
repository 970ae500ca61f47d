#include "app/train/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".lock";
constexpr const char* kLastCheckpoint = "last.safetensors";
constexpr int kMaxRunNumber = 9999;

void create_folder(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  CNN_CHECK(!ec, "cannot create the run folder '{}': {}", dir, ec.message());
}

// Follows p while it is a symbolic link (a relative target is relative to the link's folder).
fs::path follow_links(fs::path p) {
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(p, ec)) return p;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) return p;
    p = (target.is_absolute() ? target : p.parent_path() / target).lexically_normal();
  }
  CNN_FAIL("'{}': too many levels of symbolic links", p.string());
}

std::string folder_of(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  return parent.empty() ? "." : parent.string();
}

// The entries of a run folder, for messages: "train.log, metrics.csv, ...".
std::string list_entries(const std::string& dir) {
  std::string out;
  int shown = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == kLockFile) continue;
    if (shown == 4) return out + ", ...";
    out += (shown++ ? ", " : "") + n;
  }
  return out;
}

bool plain_word(const std::string& s) {
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("_-./+:=@%", c)) return false;
  return !s.empty();
}

std::string shell_quote(const std::string& s) {
  if (plain_word(s)) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::unique_ptr<FolderLock> FolderLock::try_lock(const std::string& dir, std::string* holder_pid) {
  create_folder(dir);
  const std::string path = dir + "/" + kLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CNN_CHECK(fd >= 0, "cannot open the lock file '{}': {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t got = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    CNN_CHECK(err == EWOULDBLOCK, "cannot lock '{}': {}", path, std::strerror(err));
    std::string pid(buf, size_t(std::max<ssize_t>(0, got)));
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    *holder_pid = pid;
    return nullptr;
  }
  // The pid is only a note for the refusal message; the lock itself is the flock.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    const int err = errno;
    ::close(fd);
    CNN_FAIL("cannot write the lock file '{}': {}", path, std::strerror(err));
  }
  return std::unique_ptr<FolderLock>(new FolderLock(fd));
}

std::unique_ptr<FolderLock> FolderLock::lock(const std::string& dir) {
  std::string holder;
  std::unique_ptr<FolderLock> l = try_lock(dir, &holder);
  CNN_CHECK(l != nullptr,
            "'{}' is in use by another ./train (pid {}); wait for it to finish or stop it, or "
            "train elsewhere",
            dir, holder.empty() ? "unknown" : holder);
  return l;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

const std::vector<std::string>& run_file_names() {
  static const std::vector<std::string> names = {
      "train.log",        "metrics.csv",      "config.yaml",          "confusion.csv",
      "last.safetensors", "best.safetensors", "checkpoint_times.json"};
  return names;
}

bool folder_holds_a_run(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != kLockFile) return true;
  return false;
}

std::string resolve_resume_path(const std::string& arg) {
  CNN_CHECK(!arg.empty(), "--resume needs a checkpoint file or a run folder");
  fs::path p = follow_links(arg);
  std::error_code ec;
  CNN_CHECK(fs::exists(p, ec), "--resume {}: no such checkpoint file or run folder", arg);
  if (fs::is_directory(p, ec)) {
    p /= kLastCheckpoint;
    CNN_CHECK(fs::exists(p, ec),
              "--resume {}: the folder has no {} (is it a run folder? a run writes its first "
              "checkpoint at the end of its first epoch or at checkpoint.every_steps)",
              arg, kLastCheckpoint);
  }
  // The checkpoint's own folder is where the run continues: follow a link to it too.
  return (follow_links(folder_of(p.string())) / p.filename()).string();
}

RunFolders::RunFolders(const RunFolderRequest& req) : overwrite_(req.overwrite) {
  CNN_CHECK(req.resume.empty() || !req.overwrite,
            "--overwrite starts a run afresh and --resume continues one; use only one");
  if (!req.resume.empty()) {
    ckpt_dir_ = folder_of(req.resume);
    run_dir_ = req.log_dir.empty() ? ckpt_dir_ : req.log_dir;
  } else if (!req.log_dir.empty() || req.overwrite) {
    run_dir_ = req.log_dir.empty() ? req.logs_root + "/" + req.name : req.log_dir;
    if (req.log_dir.empty()) latest_link_ = req.logs_root + "/" + req.name + "-latest";
  } else {
    // The first free folder of N, N-2, N-3, ...: missing or empty, and not locked by a run that
    // has just claimed it (two runs started together get two folders).
    for (int k = 1; k <= kMaxRunNumber && !run_lock_; ++k) {
      const std::string cand =
          req.logs_root + "/" + req.name + (k == 1 ? "" : "-" + std::to_string(k));
      std::error_code ec;
      if (fs::exists(cand, ec) && (!fs::is_directory(cand, ec) || folder_holds_a_run(cand)))
        continue;
      std::string holder;
      run_lock_ = FolderLock::try_lock(cand, &holder);
      if (run_lock_ && folder_holds_a_run(cand)) run_lock_.reset();  // claimed meanwhile
      if (run_lock_) run_dir_ = cand;
    }
    CNN_CHECK(run_lock_ != nullptr, "no free run folder among {}/{}, {}-2, ... {}-{}",
              req.logs_root, req.name, req.name, req.name, kMaxRunNumber);
    if (run_dir_ != req.logs_root + "/" + req.name)
      note_ = fmt::format(
          "{}/{} holds an earlier run: this one goes to {} (--overwrite replaces "
          "the earlier one instead)",
          req.logs_root, req.name, run_dir_);
    latest_link_ = req.logs_root + "/" + req.name + "-latest";
  }
  if (!run_lock_) run_lock_ = FolderLock::lock(run_dir_);
  if (req.resume.empty() && !req.overwrite && !req.log_dir.empty())
    CNN_CHECK(!folder_holds_a_run(run_dir_),
              "--log-dir {} already holds a run ({}): continue it with --resume {}, replace it "
              "with --overwrite, or leave out --log-dir for a new folder under {}",
              run_dir_, list_entries(run_dir_), run_dir_, req.logs_root);
  if (req.resume.empty()) ckpt_dir_ = req.checkpoint_dir.empty() ? run_dir_ : req.checkpoint_dir;
  if (ckpt_dir_ != run_dir_) {
    ckpt_lock_ = FolderLock::lock(ckpt_dir_);
    std::error_code ec;
    const bool has_checkpoints = fs::exists(ckpt_dir_ + "/" + kLastCheckpoint, ec) ||
                                 fs::exists(ckpt_dir_ + "/best.safetensors", ec);
    CNN_CHECK(!req.resume.empty() || req.overwrite || !has_checkpoints,
              "checkpoint.dir {} already holds checkpoints of a run: continue it with --resume "
              "{}, or replace them with --overwrite",
              ckpt_dir_, ckpt_dir_);
  }
}

void RunFolders::start_run() {
  if (overwrite_) {
    for (const std::string& dir : {run_dir_, ckpt_dir_})
      for (const std::string& f : run_file_names()) {
        std::error_code ec;
        fs::remove(dir + "/" + f, ec);
        CNN_CHECK(!ec, "--overwrite: cannot delete {}/{}: {}", dir, f, ec.message());
      }
  }
  if (latest_link_.empty()) return;
  // A symlink made aside and renamed over the old one: a reader always sees one or the other.
  const std::string target = fs::path(run_dir_).filename().string();
  const std::string tmp = latest_link_ + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  if (fs::exists(latest_link_, ec) && !fs::is_symlink(latest_link_, ec)) return;  // not ours
  fs::remove(tmp, ec);
  fs::create_directory_symlink(target, tmp, ec);
  if (!ec && std::rename(tmp.c_str(), latest_link_.c_str()) != 0) fs::remove(tmp, ec);
}

std::string continue_command(const std::string& program, const std::string& run_dir,
                             const std::string& ckpt_dir) {
  std::string cmd =
      shell_quote(program.empty() ? "./train" : program) + " --resume " + shell_quote(ckpt_dir);
  if (run_dir != ckpt_dir) cmd += " --log-dir " + shell_quote(run_dir);
  return cmd;
}

}  // namespace cnn
