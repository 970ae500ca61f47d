#pragma once
// Where a run writes, so that runs never clobber each other (docs/training.md, "Where a run writes"):
// - a fresh run of name N takes <logging.dir>/N when that folder is missing or empty, else the
//   first free of N-2, N-3, ...; <logging.dir>/N-latest is then pointed at it (atomically);
// - --overwrite takes <logging.dir>/N (or --log-dir) as it is, deleting the previous run's files;
// - --log-dir DIR is refused when DIR holds a run, unless --overwrite or --resume;
// - --resume CKPT continues in the checkpoint's own folder (--resume RUN_DIR: its
// last.safetensors);
// - the run holds an flock on <folder>/.lock (its pid inside) while it lives: a second run on the
//   same folder is refused naming that pid; the kernel drops the lock when the process dies, so a
//   kill -9 leaves nothing stale.
#include <memory>
#include <string>
#include <vector>

namespace cnn {

// An exclusive flock on <dir>/.lock, held until destruction (or process death).
class FolderLock {
 public:
  // Creates dir if needed. Returns null when another process holds the lock, with its pid (as
  // written in the file; "" when it has not written it yet) in *holder_pid.
  static std::unique_ptr<FolderLock> try_lock(const std::string& dir, std::string* holder_pid);
  // The same, but a held lock is an error naming the folder and the holder's pid.
  static std::unique_ptr<FolderLock> lock(const std::string& dir);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// The files a run writes into its folders (what --overwrite deletes, and what "holds a run" means
// besides any other entry).
const std::vector<std::string>& run_file_names();

// True when dir exists and has an entry other than the lock file.
bool folder_holds_a_run(const std::string& dir);

// --resume's argument as a checkpoint path: a folder stands for its last.safetensors; symbolic
// links (e.g. logs/N-latest) are followed, so that the run keeps writing to the folder it
// started in even when the link moves on to a newer run.
std::string resolve_resume_path(const std::string& arg);

struct RunFolderRequest {
  std::string name;            // the run name (config `name`)
  std::string logs_root;       // logging.dir
  std::string log_dir;         // --log-dir ("" unless given)
  std::string checkpoint_dir;  // checkpoint.dir when set apart from <logging.dir>/<name>, else ""
  std::string resume;          // the resolved checkpoint of --resume ("" for a fresh run)
  bool overwrite = false;      // --overwrite
};

// The claimed folders of one run, locked for its lifetime.
class RunFolders {
 public:
  // Chooses, creates and locks the folders as the rules above say; throws cnn::Error (one line:
  // the folder, what holds it, what to do) when it may not.
  explicit RunFolders(const RunFolderRequest& req);

  const std::string& run_dir() const { return run_dir_; }    // logs, metrics, config
  const std::string& ckpt_dir() const { return ckpt_dir_; }  // checkpoints
  // What the choice was, for the log ("" when the folder was the obvious one).
  const std::string& note() const { return note_; }

  // Once the run has started: --overwrite deletes the previous run's files (before anything of
  // this run is written), and a fresh run under <logging.dir> becomes <name>-latest.
  void start_run();

 private:
  std::string run_dir_, ckpt_dir_, note_, latest_link_;
  bool overwrite_ = false;
  std::unique_ptr<FolderLock> run_lock_, ckpt_lock_;
};

// The shell command that continues a stopped run: "<program> --resume <ckpt_dir>" (plus
// --log-dir when the logs live elsewhere), its paths quoted for the shell where needed.
std::string continue_command(const std::string& program, const std::string& run_dir,
                             const std::string& ckpt_dir);

}  // namespace cnn
