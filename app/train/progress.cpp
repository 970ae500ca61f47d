#include "app/train/progress.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace cnn {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMinBar = 10, kMaxBar = 20;

struct Field {
  std::string text;  // "" for the bar, which takes the room left
  int keep;          // higher: dropped later when the line is too wide
  bool bar = false;
};

std::string bar_text(int64_t done, int64_t total, int inner) {
  const int filled =
      total > 0 ? int(std::min<int64_t>(inner, inner * std::max<int64_t>(done, 0) / total)) : inner;
  std::string s = "[" + std::string(size_t(filled), '=');
  if (filled < inner) s += '>' + std::string(size_t(inner - filled - 1), ' ');
  return s + "]";
}

// Joins the fields with single spaces within `width`. The bar keeps its full kMaxBar while
// fields less useful than it can be dropped (so that it does not change length as the numbers
// do); then it shrinks to kMinBar, then more useful fields go, least useful first.
std::string fit(std::vector<Field> fields, int width, int64_t done, int64_t total) {
  width = std::max(width, 1);
  int bar_keep = 0;
  for (const Field& f : fields)
    if (f.bar) bar_keep = f.keep;
  auto line_width = [&](int bar) {
    int w = -1;
    for (const Field& f : fields) w += 1 + (f.bar ? bar + 2 : int(f.text.size()));
    return w;
  };
  auto drop_least = [&](int below) {
    auto least = std::min_element(fields.begin(), fields.end(),
                                  [](const Field& a, const Field& b) { return a.keep < b.keep; });
    if (fields.size() == 1 || least->keep >= below) return false;
    fields.erase(least);
    return true;
  };
  while (line_width(kMaxBar) > width && drop_least(bar_keep)) {
  }
  while (line_width(kMinBar) > width && drop_least(1 << 30)) {
  }
  const int bar = std::clamp(width - line_width(0), kMinBar, kMaxBar);
  std::string line;
  for (const Field& f : fields) {
    if (!line.empty()) line += ' ';
    line += f.bar ? bar_text(done, total, bar) : f.text;
  }
  if (int(line.size()) > width) line.resize(size_t(width));
  return line;
}

std::vector<Field> common_fields(const ProgressFrame& f) {
  std::vector<Field> v;
  v.push_back({fmt::format("epoch {}/{}", f.epoch + 1, f.epochs), 100});
  v.push_back({"", 55, true});
  v.push_back({fmt::format("{}/{}", f.batch, f.batches), 90});
  return v;
}

void add_metrics(const ProgressFrame& f, std::vector<Field>& v) {
  if (f.loss >= 0) v.push_back({fmt::format("loss {:.4f}", f.loss), 70});
  if (f.accuracy >= 0) v.push_back({fmt::format("acc {:.2f}%", 100 * f.accuracy), 60});
  if (f.images_per_s >= 0) v.push_back({fmt::format("{:.0f} img/s", f.images_per_s), 50});
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string render_progress_line(const ProgressFrame& f, int width) {
  std::vector<Field> v = common_fields(f);
  add_metrics(f, v);
  if (f.epoch_eta_s >= 0) v.push_back({"ETA " + format_duration(f.epoch_eta_s), 80});
  if (f.run_eta_s >= 0 && f.epochs > f.epoch + 1)
    v.push_back({"run ETA " + format_duration(f.run_eta_s), 45});
  if (f.lr >= 0) v.push_back({fmt::format("lr {:.3g}", f.lr), 10});
  return fit(std::move(v), width, f.batch, f.batches);
}

std::string render_epoch_line(const ProgressFrame& f, int width) {
  std::vector<Field> v = common_fields(f);
  if (f.epoch_elapsed_s >= 0) v.push_back({format_duration(f.epoch_elapsed_s), 80});
  add_metrics(f, v);
  return fit(std::move(v), width, f.batch, f.batches);
}

int terminal_width(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

ProgressDisplay::ProgressDisplay(std::FILE* out) : out_(out) {}

ProgressDisplay::~ProgressDisplay() {
  if (started_ && !epoch_finished_ && frame_.batch >= frame_.batches) finish_epoch();
  before_log();
}

int ProgressDisplay::width() const {
  // One column less than the terminal: a line that fills the last column wraps on some
  // terminals, and "\r" would then redraw only its second half.
  return std::max(1, terminal_width(fileno(out_)) - 1);
}

void ProgressDisplay::update(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches,
                             double lr, double epoch_eta_s) {
  const auto now = Clock::now();
  if (!started_ || epoch != frame_.epoch) {
    if (started_) {
      if (!epoch_finished_) finish_epoch();
      last_epoch_s_ = std::chrono::duration<double>(now - epoch_start_).count();
    }
    started_ = true;
    epoch_finished_ = false;
    epoch_start_ = now;
    frame_ = ProgressFrame{};
    frame_.epoch = epoch;
    loss_sum_ = acc_sum_ = weight_ = 0;
    window_start_batch_ = std::max<int64_t>(batch - 1, 0);  // a resume starts mid-epoch
  }
  frame_.epochs = epochs;
  frame_.batch = batch;
  frame_.batches = batches;
  frame_.lr = lr;
  frame_.epoch_elapsed_s = std::chrono::duration<double>(now - epoch_start_).count();
  frame_.epoch_eta_s = epoch_eta_s;
  // The epochs after this one take as long as the last whole one did (its evaluation included),
  // or, in the first, as long as this one is expected to.
  const double per_epoch =
      last_epoch_s_ > 0 ? last_epoch_s_ : frame_.epoch_elapsed_s + std::max(0.0, epoch_eta_s);
  frame_.run_eta_s = std::max(0.0, epoch_eta_s) + double(epochs - epoch - 1) * per_epoch;
  draw(batch >= batches);
}

void ProgressDisplay::add_window(double loss, double accuracy, double images_per_s) {
  if (!started_ || epoch_finished_) return;
  const double w = double(std::max<int64_t>(frame_.batch - window_start_batch_, 1));
  window_start_batch_ = frame_.batch;
  if (std::isfinite(loss) && std::isfinite(accuracy)) {
    loss_sum_ += w * loss;
    acc_sum_ += w * accuracy;
    weight_ += w;
    frame_.loss = loss_sum_ / weight_;
    frame_.accuracy = acc_sum_ / weight_;
  }
  if (std::isfinite(images_per_s) && images_per_s > 0) frame_.images_per_s = images_per_s;
  if (frame_.batch >= frame_.batches)
    finish_epoch();
  else
    draw(true);
}

void ProgressDisplay::finish_epoch() {
  std::fprintf(out_, "\r\033[K%s\n", render_epoch_line(frame_, width()).c_str());
  std::fflush(out_);
  visible_ = false;
  epoch_finished_ = true;
}

void ProgressDisplay::before_log() {
  if (started_ && !epoch_finished_ && frame_.batch >= frame_.batches) {
    finish_epoch();
    return;
  }
  if (!visible_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  visible_ = false;
}

void ProgressDisplay::after_log() {
  if (started_ && !epoch_finished_) draw(true);
}

void ProgressDisplay::draw(bool force) {
  const auto now = Clock::now();
  if (!force && visible_ && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  std::fprintf(out_, "\r\033[K%s", render_progress_line(frame_, width()).c_str());
  std::fflush(out_);
  visible_ = true;
}

}  // namespace cnn
