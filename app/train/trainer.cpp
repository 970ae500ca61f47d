#include "app/train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>

#include "app/train/batch_source.h"
#include "app/config/config.h"
#include "app/train/evaluate.h"
#include "app/train/run_log.h"
#include "app/train/step_graph.h"
#include "data/check_data.h"
#include "data/load_data.h"
#include "runtime/error.h"
#include "kernels/optimizer/optimizer.h"
#include "kernels/loss/softmax_xent.h"
#include "runtime/atomic_file.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/lr_schedule.h"
#include "layers/param_optimizer.h"

namespace cnn {
namespace {

// The one process-wide mutable value: a signal handler can only talk to the loop through it.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

// Routes SIGINT/SIGTERM to the loop (stop at the next step boundary with a checkpoint) while a
// run lasts and gives the previous handlers back afterwards: a process that trains in-process
// (the tests) must still die of a SIGTERM sent after its training returned.
class StopSignalScope {
 public:
  StopSignalScope() {
    g_stop_signal = 0;
    prev_int_ = std::signal(SIGINT, on_stop_signal);
    prev_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignalScope() {
    std::signal(SIGINT, prev_int_ == SIG_ERR ? SIG_DFL : prev_int_);
    std::signal(SIGTERM, prev_term_ == SIG_ERR ? SIG_DFL : prev_term_);
  }
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  void (*prev_int_)(int) = SIG_DFL;
  void (*prev_term_)(int) = SIG_DFL;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Names the first parameter tensor holding NaN/Inf, or "" when all are finite.
std::string first_nonfinite_tensor(Network& net) {
  const Exec& ex = net.exec();
  Buffer<int32_t> flag(1, ex.device);
  for (const auto& p : net.param_infos()) {
    flag.zero(ex.stream);
    find_nonfinite(p.numel(), net.params() + p.offset, flag.data(), ex);
    int32_t h = 0;
    raw_copy(&h, Device::CPU, flag.data(), ex.device, sizeof(h));
    if (h) return p.name;
  }
  return "";
}

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainArgs& args) : cfg_(cfg), args_(args) {}
  int run();

 private:
  void save(const std::string& file, const TrainPosition& pos);
  bool log_point(int64_t epoch, double lr);  // false: stop (NaN)

  const TrainConfig& cfg_;
  const TrainArgs& args_;
  Exec ex_;
  std::unique_ptr<TrainStream> stream_;  // outlives everything that launches on it
  std::string run_dir_, ckpt_dir_;
  DataSplits data_;
  Normalization norm_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<ParamOptimizer> opt_;
  std::unique_ptr<RunLog> log_;
  TrainPosition pos_;
  Buffer<double> totals_;  // device: loss sum, correct, count since the last logging point
  Clock::time_point start_ = Clock::now(), last_log_ = Clock::now();
  int64_t images_since_log_ = 0;
};

void Trainer::save(const std::string& file, const TrainPosition& pos) {
  const std::string path = ckpt_dir_ + "/" + file;
  // The loss is only looked at on logging steps, so the weights may have diverged since: a
  // checkpoint with NaN/Inf weights would replace the last good one.
  const std::string bad = first_nonfinite_tensor(*net_);
  CNN_CHECK(bad.empty(),
            "step {}: parameter tensor '{}' holds non-finite values (NaN/Inf) — stopping without "
            "writing {} (the last checkpoint there is intact; try a lower learning rate)",
            pos.global_step, bad, path);
  CheckpointMeta m;
  m.config_yaml = cfg_.resolved_yaml;
  m.class_names = data_.train.class_names;
  m.input_chw = cfg_.model.input_chw;
  m.mean = norm_.mean;
  m.std = norm_.std;
  m.position = pos;
  m.seed = cfg_.training.seed;
  try {
    save_checkpoint(path, *net_, opt_.get(), m);
  } catch (const Error& e) {
    CNN_FAIL("step {}: saving the checkpoint failed, the previous one is unchanged: {}",
             pos.global_step, e.what());
  }
}

bool Trainer::log_point(int64_t epoch, double lr) {
  double t[3] = {0, 0, 0};
  raw_copy(t, Device::CPU, totals_.data(), ex_.device, sizeof(t));  // the step's one sync
  totals_.zero(ex_.stream);
  if (t[2] == 0) return true;
  const double loss = t[0] / t[2], acc = t[1] / t[2];
  const double ips = images_since_log_ / std::max(1e-9, seconds_since(last_log_));
  last_log_ = Clock::now();
  images_since_log_ = 0;
  if (!std::isfinite(loss)) {
    const std::string bad = first_nonfinite_tensor(*net_);
    CNN_FAIL(
        "step {}: the training loss is {}; {} — stopping (the last checkpoint in {} is "
        "intact; try a lower learning rate)",
        pos_.global_step, loss,
        bad.empty() ? "the parameters are finite, the logits overflowed"
                    : "first layer with non-finite values: " + bad,
        ckpt_dir_);
  }
  log_->info("epoch {} step {}: loss {:.4f} acc {:.2f}% lr {:.4g} {:.0f} img/s", epoch + 1,
             pos_.global_step, loss, 100 * acc, lr, ips);
  log_->metrics({seconds_since(start_), epoch + 1, pos_.global_step, "train", loss, acc, lr, ips});
  return true;
}

int Trainer::run() {
  CNN_CHECK(args_.resume.empty() || args_.init_weights.empty(),
            "--resume and --init-weights cannot be used together");
  const TrainingOptions& tr = cfg_.training;
  ex_.device = resolve_device(tr.device);
  ex_.precision = tr.precision;
  ex_.deterministic = tr.deterministic;
  stream_ = std::make_unique<TrainStream>(ex_.device);
  ex_.stream = stream_->get();
  run_dir_ = args_.log_dir.empty() ? cfg_.run_dir() : args_.log_dir;
  ckpt_dir_ = cfg_.checkpoint.dir.empty() ||
                      (!args_.log_dir.empty() && cfg_.checkpoint.dir == cfg_.run_dir())
                  ? run_dir_
                  : cfg_.checkpoint.dir;

  // Everything that can refuse (checkpoint, data) is checked before anything is written.
  const std::string& ckpt_in = args_.resume.empty() ? args_.init_weights : args_.resume;
  CheckpointMeta ckpt_meta;
  if (!ckpt_in.empty()) ckpt_meta = read_checkpoint_meta(ckpt_in);

  data_ = load_data(cfg_.data);
  const Dataset& eval_set = data_.val.n > 0 ? data_.val : data_.test;
  std::vector<float> mean = cfg_.data.mean, stdv = cfg_.data.std;
  if (mean.empty() && !ckpt_in.empty()) {
    mean = ckpt_meta.mean;
    stdv = ckpt_meta.std;
  }
  norm_ = resolve_normalization(mean, stdv, data_.train);

  NetworkOptions nopt;
  nopt.max_batch = tr.batch_size;
  nopt.seed = tr.seed;
  nopt = with_env_switches(nopt, read_env_switches());  // read once per run, at its start
  try {
    net_ = std::make_unique<Network>(cfg_.model.layers, cfg_.model.input_chw, nopt, ex_);
  } catch (const Error& e) {
    CNN_FAIL("cannot set up the network for batch {} on {}: {}", tr.batch_size,
             device_name(ex_.device), e.what());
  }
  CNN_CHECK(net_->num_classes() == data_.train.num_classes(),
            "the model ends in {} classes but the dataset has {} ({})", net_->num_classes(),
            data_.train.num_classes(), data_.train.source);
  opt_ = std::make_unique<ParamOptimizer>(cfg_.optimizer, *net_);
  if (!ckpt_in.empty()) {
    Checkpoint ck = load_checkpoint_for(ckpt_in, *net_);
    net_->params_from_host(ck.params);
    if (!args_.resume.empty()) {
      opt_->state_from_host(ck.optimizer_state, ck.meta.position.global_step);
      pos_ = ck.meta.position;
    }
  }

  log_ = std::make_unique<RunLog>(run_dir_, cfg_.logging.progress != ProgressMode::Off);
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir_, ec);
  CNN_CHECK(!ec, "cannot create the checkpoint directory '{}': {}", ckpt_dir_, ec.message());
  for (const std::string& dir : {run_dir_, ckpt_dir_})
    for (const std::string& f : remove_stale_temp_files(dir))
      log_->warn("removed {}, left by an interrupted write", f);
  write_file_atomically(run_dir_ + "/config.yaml", cfg_.resolved_yaml.data(),
                        cfg_.resolved_yaml.size());

  log_->info("run '{}' on {} | precision {} | algo {} | deterministic {} | seed {}", cfg_.name,
             device_description(ex_.device), precision_name(ex_.precision), algo_name(tr.algo),
             tr.deterministic, tr.seed);
  log_->info("network (batch {}):\n{}", tr.batch_size,
             format_network_summary(summarize_network(cfg_.model.layers, cfg_.model.input_chw)));
  log_->info("data: train {} images ({}), {} {} images, {} classes, normalization {}",
             data_.train.n, data_.train.source, data_.val.n > 0 ? "validation" : "test", eval_set.n,
             data_.train.num_classes(), normalization_str(norm_));
  for (const std::string& line : net_->fusion_notes()) log_->info("fusion: {}", line);
  for (const std::string& line : net_->autotune()) log_->info("algo auto: {}", line);
  if (data_.train.skipped > 0)
    log_->warn("skipped {} unreadable training images, e.g. {}", data_.train.skipped,
               data_.train.skipped_examples.empty() ? "" : data_.train.skipped_examples[0]);
  if (!args_.resume.empty())
    log_->info("resuming from {} at epoch {} batch {} (step {})", args_.resume, pos_.epoch + 1,
               pos_.batch_in_epoch, pos_.global_step);
  if (!args_.init_weights.empty()) log_->info("initial weights from {}", args_.init_weights);

  std::unique_ptr<BatchSource> train_src, eval;
  try {
    train_src = std::make_unique<BatchSource>(data_.train, norm_, &cfg_.data.augment, tr.seed,
                                              tr.batch_size, true, cfg_.data.drop_last, ex_);
    if (eval_set.n > 0)
      eval = std::make_unique<BatchSource>(eval_set, norm_, nullptr, tr.seed, tr.batch_size, false,
                                           false, ex_, true);
  } catch (const Error& e) {
    CNN_FAIL("cannot set up the datasets ({} + {} images, batch {}) on {}: {}", data_.train.n,
             eval_set.n, tr.batch_size, device_name(ex_.device), e.what());
  }
  BatchSource& train = *train_src;
  totals_ = Buffer<double>(3, ex_.device);
  totals_.zero(ex_.stream);

  const StopSignalScope stop_signals;

  const int64_t steps_per_epoch = train.batches_per_epoch();
  CNN_CHECK(steps_per_epoch > 0, "the training set ({} images) gives no batch of {} (drop_last)",
            data_.train.n, tr.batch_size);
  // A fresh run starts metrics.csv afresh; a resume drops the rows past its checkpoint, and the
  // evaluation that it runs again when the checkpoint was taken on an epoch's last batch.
  log_->truncate_metrics_after(pos_.global_step, pos_.batch_in_epoch < steps_per_epoch);
  const double total_epochs = tr.epochs;
  EvalResult last_eval;
  bool stopped = false;
  double lr = cfg_.optimizer.lr;
  // A step's launches: all that changes between steps is read from `state` on the device, so
  // the same launches (captured once as a CUDA graph) serve every full batch.
  const std::string graph_off =
      cuda_graph_off_reason(ex_.device, tr.cuda_graph, opt_->syncs_host());
  log_->info("CUDA graph: {}", graph_off.empty()
                                   ? "on (the training step is captured after one plain step, "
                                     "then replayed once per full batch)"
                                   : "off (" + graph_off + ")");
  StepState state(ex_, steps_per_epoch);
  train.use_batch_counter(state.batch());
  StepGraph graph(ex_, graph_off.empty());
  int n = 0;
  const std::function<void()> step_launches = [&] {
    train.gather(n);
    net_->forward_backward(n, train.x(), train.labels(), 1.0f / float(n));
    accumulate_metrics(n, net_->loss_rows(), net_->predictions(), train.labels(), totals_.data(),
                       ex_);
    opt_->step_from(state.lr(), state.update());
    state.advance();
  };
  for (int64_t epoch = pos_.epoch; epoch < tr.epochs && !stopped; ++epoch) {
    const auto epoch_start = Clock::now();
    train.start_epoch(epoch, epoch == pos_.epoch ? pos_.batch_in_epoch : 0);
    pos_.epoch = epoch;
    // Batch k of the epoch runs at global step first_step + k (also after a resume inside it);
    // the optimizer's update number is the global step after the update.
    const int64_t first_step = pos_.global_step - train.position();
    state.start_epoch(
        epoch_lr_table(cfg_.schedule, cfg_.optimizer.lr, first_step, steps_per_epoch, total_epochs),
        train.position(), pos_.global_step + 1);
    for (;;) {
      const int64_t batch_index = train.position();
      if (!train.take(&n)) break;
      lr = state.lr_at(batch_index);
      graph.run(step_launches, n == tr.batch_size);
      bool warning = false;
      if (const std::string news = graph.take_news(&warning); !news.empty()) {
        if (warning)
          log_->warn("step {}: {}", pos_.global_step + 1, news);
        else
          log_->info("step {}: {}", pos_.global_step + 1, news);
      }
      ++pos_.global_step;
      pos_.batch_in_epoch = train.position();
      images_since_log_ += n;
      const bool at_log =
          cfg_.logging.every_steps > 0 && pos_.global_step % cfg_.logging.every_steps == 0;
      if (at_log) log_point(epoch, lr);
      const double elapsed = seconds_since(epoch_start);
      log_->progress(epoch, tr.epochs, pos_.batch_in_epoch, steps_per_epoch, lr,
                     elapsed / double(std::max<int64_t>(1, pos_.batch_in_epoch)) *
                         double(steps_per_epoch - pos_.batch_in_epoch));
      if (cfg_.checkpoint.every_steps > 0 && pos_.global_step % cfg_.checkpoint.every_steps == 0)
        save("last.safetensors", pos_);
      if (g_stop_signal) {
        log_->clear_bar();
        save("last.safetensors", pos_);
        log_->info(
            "stopped by signal {} at step {}; checkpoint {}/last.safetensors (continue "
            "with --resume)",
            int(g_stop_signal), pos_.global_step, ckpt_dir_);
        return 0;
      }
      if (tr.max_steps > 0 && pos_.global_step >= tr.max_steps) {
        stopped = true;
        break;
      }
    }
    log_point(epoch, lr);
    stream_sync(ex_.device, ex_.stream);
    const double train_s = seconds_since(epoch_start);
    const bool epoch_done = !stopped || pos_.batch_in_epoch >= steps_per_epoch;
    TrainPosition next = pos_;
    if (epoch_done) {
      next.epoch = epoch + 1;
      next.batch_in_epoch = 0;
    }
    const bool last_epoch = epoch + 1 == tr.epochs || stopped;
    if (eval && ((epoch + 1) % tr.eval_every_epochs == 0 || last_epoch)) {
      const auto eval_start = Clock::now();
      last_eval = evaluate(*net_, *eval);
      const double eval_s = seconds_since(eval_start);
      log_->info(
          "epoch {} {}: loss {:.4f} accuracy {:.2f}% ({} images) | epoch time {:.2f} s "
          "(train {:.2f} s, eval {:.2f} s), {:.1f} s elapsed",
          epoch + 1, data_.val.n > 0 ? "validation" : "test", last_eval.loss,
          100 * last_eval.accuracy, last_eval.count, train_s + eval_s, train_s, eval_s,
          seconds_since(start_));
      log_->metrics({seconds_since(start_), epoch + 1, pos_.global_step, "eval", last_eval.loss,
                     last_eval.accuracy, lr, 0});
      CNN_CHECK(std::isfinite(last_eval.loss), "epoch {}: the evaluation loss is {}; stopping",
                epoch + 1, last_eval.loss);
      // Written before the final checkpoint: a run killed after that checkpoint is complete, as
      // a resume from it has nothing left to run.
      if (last_epoch) {
        log_->info("confusion matrix ({}):\n{}", data_.val.n > 0 ? "validation" : "test",
                   format_confusion(last_eval, data_.train.class_names));
        const std::string csv = confusion_csv(last_eval, data_.train.class_names);
        write_file_atomically(run_dir_ + "/confusion.csv", csv.data(), csv.size());
      }
      if (last_eval.accuracy > next.best_accuracy) {
        next.best_accuracy = last_eval.accuracy;
        if (cfg_.checkpoint.keep_best) save("best.safetensors", next);
      }
    }
    pos_ = next;
    if ((cfg_.checkpoint.every_epochs > 0 && (epoch + 1) % cfg_.checkpoint.every_epochs == 0) ||
        last_epoch)
      save("last.safetensors", pos_);
  }
  log_->info("done: {} steps in {:.1f} s; best accuracy {:.2f}%; checkpoints in {}",
             pos_.global_step, seconds_since(start_), 100 * std::max(0.0, pos_.best_accuracy),
             ckpt_dir_);
  return 0;
}

}  // namespace

int run_training(const TrainConfig& cfg, const TrainArgs& args) {
  return Trainer(cfg, args).run();
}

int run_check_data(const TrainConfig& cfg) {
  int64_t problems = 0;
  std::printf("%s", check_data_report(cfg.data, &problems).c_str());
  return problems ? 1 : 0;
}

}  // namespace cnn
