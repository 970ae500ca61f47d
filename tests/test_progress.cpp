// The progress display of ./train: lines fitted to the terminal width, the finished epochs' lines
// kept, log lines that do not break the bar; drawn into a real pseudo-terminal of fixed width.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/train/progress.h"
#include "app/train/end_summary.h"

namespace {

cnn::ProgressFrame full_frame() {
  cnn::ProgressFrame f;
  f.epoch = 2;
  f.epochs = 8;
  f.batch = 212;
  f.batches = 469;
  f.loss = 0.0712;
  f.accuracy = 0.9781;
  f.images_per_s = 5120;
  f.lr = 0.05;
  f.epoch_elapsed_s = 10;
  f.epoch_eta_s = 12.4;
  f.run_eta_s = 100;
  return f;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Progress, WideLineShowsEverything) {
  const std::string line = cnn::render_progress_line(full_frame(), 200);
  for (const char* part : {"epoch 3/8", "[", "212/469", "loss 0.0712", "acc 97.81%", "5120 img/s",
                           "ETA 0:12", "run ETA 1:40", "lr 0.05"})
    EXPECT_TRUE(contains(line, part)) << part << " missing in: " << line;
  // The bar keeps one length while the numbers around it change width (no jitter).
  for (int width = 96; width <= 200; ++width) {
    const std::string l = cnn::render_progress_line(full_frame(), width);
    ASSERT_EQ(l.find(']') - l.find('['), 21u) << width << ": " << l;
    EXPECT_TRUE(contains(l, "run ETA 1:40")) << width << ": " << l;
  }
}

TEST(Progress, EveryWidthIsRespectedAndTheMostUsefulFieldsStay) {
  for (int width = 1; width <= 200; ++width) {
    const std::string line = cnn::render_progress_line(full_frame(), width);
    ASSERT_LE(int(line.size()), width) << line;
    EXPECT_EQ(line.find_first_of("\r\n\033"), std::string::npos);
    const std::string done = cnn::render_epoch_line(full_frame(), width);
    ASSERT_LE(int(done.size()), width) << done;
    if (width >= 40) {
      EXPECT_TRUE(contains(line, "epoch 3/8")) << width << ": " << line;
      EXPECT_TRUE(contains(line, "212/469")) << width << ": " << line;
      EXPECT_TRUE(contains(line, "ETA 0:12")) << width << ": " << line;
    }
    if (width >= 80) {  // the classic terminal: bar, loss and accuracy fit
      EXPECT_TRUE(contains(line, "[")) << line;
      EXPECT_TRUE(contains(line, "loss 0.0712")) << line;
      EXPECT_TRUE(contains(line, "acc 97.81%")) << line;
    }
  }
  // The lr goes first, the epoch last.
  const std::string narrow = cnn::render_progress_line(full_frame(), 60);
  EXPECT_FALSE(contains(narrow, "lr ")) << narrow;
  EXPECT_TRUE(contains(narrow, "epoch 3/8")) << narrow;
}

TEST(Progress, UnknownValuesAreLeftOut) {
  cnn::ProgressFrame f;
  f.batch = 3;
  f.batches = 10;
  const std::string line = cnn::render_progress_line(f, 100);
  EXPECT_TRUE(contains(line, "epoch 1/1 [")) << line;
  EXPECT_FALSE(contains(line, "loss")) << line;
  EXPECT_FALSE(contains(line, "img/s")) << line;
  EXPECT_FALSE(contains(line, "nan")) << line;
}

TEST(Progress, Durations) {
  EXPECT_EQ(cnn::format_duration(7.4), "0:07");
  EXPECT_EQ(cnn::format_duration(750), "12:30");
  EXPECT_EQ(cnn::format_duration(3723), "1:02:03");
  EXPECT_EQ(cnn::format_duration(-1), "?");
  EXPECT_EQ(cnn::format_duration(NAN), "?");
}

// Reads what the display wrote into the pseudo-terminal.
std::string drain(int master) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// What a terminal would show: each "\r" or "\033[K" (erase) restarts the line being drawn.
std::vector<std::string> screen_lines(const std::string& raw, std::string* live) {
  std::vector<std::string> lines;
  std::string cur;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw.compare(i, 3, "\033[K") == 0) {
      i += 2;
      cur.clear();
    } else if (raw[i] == '\r') {
      if (i + 1 < raw.size() && raw[i + 1] == '\n') continue;  // the tty's "\n" -> "\r\n"
      cur.clear();
    } else if (raw[i] == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += raw[i];
    }
  }
  *live = cur;
  return lines;
}

TEST(Progress, DrawsIntoAFixedWidthPseudoTerminal) {
  int master = -1, slave = -1;
  winsize ws{};
  ws.ws_col = 64;
  ws.ws_row = 24;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, &ws), 0);
  ASSERT_EQ(fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK), 0);
  std::FILE* out = fdopen(slave, "w");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(cnn::terminal_width(slave), 64);
  {
    cnn::ProgressDisplay d(out);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int b = 1; b <= 10; ++b) {
        d.update(epoch, 2, b, 10, 0.1, 10 - b);
        if (b % 5 == 0) d.add_window(0.5 / (epoch + 1), 0.8 + 0.1 * epoch, 1000);
        if (b == 3) {  // a log line in the middle of the epoch
          d.before_log();
          std::fputs("a log line\n", out);
          d.after_log();
        }
      }
      d.before_log();  // the evaluation's log line at the end of the epoch
      std::fprintf(out, "epoch %d test: ok\n", epoch + 1);
      d.after_log();
    }
  }
  std::fflush(out);
  std::string live;
  const std::vector<std::string> lines = screen_lines(drain(master), &live);
  std::fclose(out);
  ::close(master);

  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0], "a log line");
  EXPECT_TRUE(contains(lines[1], "epoch 1/2 [=")) << lines[1];
  EXPECT_TRUE(contains(lines[1], "10/10")) << lines[1];
  EXPECT_TRUE(contains(lines[1], "loss 0.5000 acc 80.00%")) << lines[1];
  EXPECT_EQ(lines[2], "epoch 1 test: ok");
  EXPECT_EQ(lines[3], "a log line");
  EXPECT_TRUE(contains(lines[4], "epoch 2/2")) << lines[4];
  EXPECT_TRUE(contains(lines[4], "loss 0.2500 acc 90.00%")) << lines[4];
  EXPECT_EQ(lines[5], "epoch 2 test: ok");
  EXPECT_EQ(live, "");  // nothing half-drawn is left behind
  for (const std::string& l : lines) EXPECT_LT(int(l.size()), 64) << l;
}

TEST(EndSummary, NamesTheBestEpochTheCheckpointsAndTheNextCommands) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("cnn_summary_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.csv") << "time_s,epoch,step,phase,loss,accuracy,lr,images_per_s\n"
                                        "1.0,1,10,train,0.9,0.70,0.1,100.0\n"
                                        "1.5,1,10,eval,0.50,0.910,0.1,0.0\n"
                                        "2.5,2,20,eval,0.30,0.955,0.1,0.0\n"
                                        "3.5,3,30,eval,0.31,0.950,0.1,0.0\n";
  std::ofstream(dir / "best.safetensors") << std::string(3000, 'x');
  std::ofstream(dir / "last.safetensors") << std::string(3000, 'x');
  cnn::EndSummaryInput in;
  in.metrics_csv = (dir / "metrics.csv").string();
  in.run_dir = in.ckpt_dir = dir.string();
  in.resume_command = "./train --resume " + dir.string();
  in.epochs = 3;
  in.steps = 30;
  in.seconds = 3.5;
  const std::string s = cnn::format_end_summary(in);
  EXPECT_TRUE(contains(s, "run finished: 3 epochs, 30 steps in 3.5 s")) << s;
  EXPECT_TRUE(contains(s, "best: epoch 2, test accuracy 95.50% (loss 0.3000)")) << s;
  EXPECT_TRUE(contains(s, (dir / "best.safetensors").string() + " (2.9 KiB)")) << s;
  EXPECT_TRUE(contains(s, (dir / "last.safetensors").string())) << s;
  EXPECT_TRUE(contains(s, "./infer --checkpoint " + dir.string() + " images/")) << s;
  EXPECT_TRUE(contains(s, "python3 scripts/plot_metrics.py " + (dir / "metrics.csv").string()))
      << s;
  EXPECT_TRUE(
      contains(s, "train longer:    ./train --resume " + dir.string() + " --set training.epochs=6"))
      << s;
  fs::remove_all(dir);
}

}  // namespace
