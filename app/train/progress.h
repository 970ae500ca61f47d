#pragma once
// The progress display of ./train on a terminal: one live line for the current epoch (bar,
// running loss and accuracy, images/s, the epoch's and the whole run's ETA), fitted to the
// terminal's width, and one line per finished epoch that stays on screen (as Keras prints them).
// Log lines printed meanwhile clear the live line, print, and let it be drawn again. Output that
// is not a terminal gets no display at all (the log lines stay plain).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cnn {

// What one line shows. Values that are not known yet are NaN (loss, accuracy) or < 0 (rates,
// times) and are left out.
struct ProgressFrame {
  int64_t epoch = 0, epochs = 1;    // epoch: 0-based
  int64_t batch = 0, batches = 0;   // batches done in this epoch, of
  double loss = -1, accuracy = -1;  // running means over the epoch so far (< 0: none yet)
  double images_per_s = -1;
  double lr = -1;
  double epoch_elapsed_s = -1, epoch_eta_s = -1, run_eta_s = -1;
};

// The live line, at most `width` columns (no control characters): fields that do not fit are
// dropped, least useful first (lr, run ETA, images/s, accuracy, loss, the bar), e.g.
// "epoch 3/8 [=========>          ] 212/469 loss 0.0712 acc 97.81% 5120 img/s ETA 0:12 run 1:40"
std::string render_progress_line(const ProgressFrame& f, int width);

// The line a finished epoch leaves on screen, fitted the same way:
// "epoch 3/8 [==============================] 469/469 0:14 loss 0.0712 acc 97.81% 5120 img/s"
std::string render_epoch_line(const ProgressFrame& f, int width);

// "0:07", "12:30", "1:02:03".
std::string format_duration(double seconds);

// The terminal's width in columns (TIOCGWINSZ on fd), else $COLUMNS, else 80.
int terminal_width(int fd);

// Draws the frames on `out` (a terminal). Not thread-safe: the training loop owns it.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(std::FILE* out);
  ~ProgressDisplay();
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  // Called every step: returns without drawing unless 200 ms passed or the epoch just ended.
  // A new epoch first leaves the previous one's line on screen.
  void update(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double lr,
              double epoch_eta_s);
  // A training window's means (a metrics.csv train row): folded into the epoch's running means,
  // weighted by the batches since the last window. At the epoch's end this leaves its line.
  void add_window(double loss, double accuracy, double images_per_s);

  // Around a log line: before() takes the live line away (a finished epoch's line stays),
  // after() draws it again.
  void before_log();
  void after_log();

 private:
  void draw(bool force);
  void finish_epoch();
  int width() const;

  std::FILE* out_;
  ProgressFrame frame_;
  bool started_ = false, visible_ = false, epoch_finished_ = false;
  double loss_sum_ = 0, acc_sum_ = 0, weight_ = 0;  // window means weighted by their batches
  int64_t window_start_batch_ = 0;
  std::chrono::steady_clock::time_point epoch_start_{}, last_draw_{};
  double last_epoch_s_ = -1;  // the previous epoch's duration, evaluation included
};

}  // namespace cnn
