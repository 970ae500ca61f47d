#pragma once
// train --gpus N on one machine: the launcher process starts N rank processes of a program
// (fork + exec, each with CNN_RANK / CNN_WORLD_SIZE / CNN_LOCAL_RANK and the NCCL id file in
// its environment), waits for them, and when one fails stops the others and says which.
#include <string>
#include <vector>

namespace cnn {

struct RankExit {
  int rank = 0;
  int pid = 0;
  bool exited = false;  // exit code in code; otherwise killed by `signal`
  int code = 0, signal = 0;
  std::string describe() const;  // "exited with status 3", "was killed by signal 9 (Killed)"
};

struct LaunchResult {
  int exit_code = 0;    // the program's: 0, the first failing rank's status, or 128 + signal
  std::string message;  // "" on success; else one line naming the rank that failed first
  std::vector<RankExit> ranks;
};

struct LaunchRequest {
  std::string exe;                // the program to run (/proc/self/exe for train itself)
  std::vector<std::string> argv;  // its arguments, argv[0] included
  int world = 1;
  // Seconds between the SIGTERM sent to the other ranks after a failure and a SIGKILL.
  double grace_s = 10;
};

// Runs the ranks to the end. SIGINT/SIGTERM sent to the launcher go to rank 0, which saves a
// checkpoint and stops; the other ranks are then stopped with SIGTERM. Throws only when a rank
// cannot be started at all.
LaunchResult launch_ranks(const LaunchRequest& req);

}  // namespace cnn
