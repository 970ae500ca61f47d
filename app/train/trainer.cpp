#include "app/train/trainer.h"

#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>

#include "app/cli_common.h"
#include "app/config/config.h"
#include "app/train/batch_source.h"
#include "app/train/checkpoint_times.h"
#include "app/train/end_summary.h"
#include "app/train/evaluate.h"
#include "app/train/resume_plan.h"
#include "app/train/run_folder.h"
#include "app/train/run_log.h"
#include "app/train/run_summary.h"
#include "app/train/startup.h"
#include "app/train/step_graph.h"
#include "data/batch_sampler.h"
#include "data/check_data.h"
#include "data/load_data.h"
#include "kernels/loss/softmax_xent.h"
#include "kernels/optimizer/optimizer.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/lr_schedule.h"
#include "layers/param_optimizer.h"
#include "runtime/atomic_file.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"

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

enum class EpochEnd { Done, MaxSteps, Signal };

// Gradient buckets of a data-parallel run: small enough that the first all-reduce starts early
// in the backward pass, large enough that NCCL's per-call latency (~10-30 us) stays small.
constexpr int64_t kGradBucketBytes = int64_t(4) << 20;

// One run: setup (folders, data, network, checkpoint, log), then per epoch the steps and the end
// of the epoch (evaluation, best and last checkpoints).
class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainArgs& args) : cfg_(cfg), args_(args) {}
  int run();

 private:
  // Setup, in order; everything that can refuse runs before anything is written.
  bool claim_folders();  // false: a finished run, nothing to do
  void load_model_and_data();
  void open_run_log();
  void prepare_steps();
  // The loop.
  EpochEnd run_epoch(int64_t epoch);
  void end_of_epoch(int64_t epoch, bool stopped);
  void evaluate_epoch(int64_t epoch, double train_s, bool last_epoch, TrainPosition* next);
  int stop_by_signal(int sig);
  void finish();
  // Rank 0's evaluation may stop the run (training.stop_at_accuracy): every rank learns it at the
  // end of each epoch, so that none waits in an all-reduce that the others never join.
  void share_stop_decision();

  void save(const std::string& file, const TrainPosition& pos);
  void log_point(int64_t epoch);
  double elapsed() const { return elapsed_before_ + seconds_since(start_); }

  const TrainConfig& cfg_;
  const TrainArgs& args_;
  // Rank 0 (or the only process) logs, evaluates and writes; other ranks only train.
  const bool lead_ = args_.rank.rank == 0;
  StartupClock startup_;
  const EnvSwitches env_ = read_env_switches();  // the CNN_* overrides, read once as the run starts
  AccuracyTarget target_{cfg_.training.stop_at_accuracy, startup_};
  Exec ex_;
  std::unique_ptr<TrainStream> stream_;  // outlives everything that launches on it
  std::unique_ptr<RunFolders> folders_;
  std::string run_dir_, ckpt_dir_, resume_ckpt_;
  std::unique_ptr<ResumePlan> plan_;
  std::vector<std::string> resume_notes_;
  DataSplits data_;
  const Dataset* eval_set_ = nullptr;
  Normalization norm_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<ParamOptimizer> opt_;
  CheckpointMeta ckpt_meta_;  // of --resume / --init-weights
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<BatchSource> train_, eval_;
  std::unique_ptr<StepState> state_;
  std::function<void()> step_launches_;
  int n_ = 0;             // the current batch's size (this rank's slice of it)
  int64_t global_n_ = 0;  // the current global batch's size (all ranks)
  int64_t steps_per_epoch_ = 0;
  TrainPosition pos_;
  double lr_ = 0;
  Buffer<double> totals_;  // device: loss sum, correct, count since the last logging point
  Clock::time_point start_ = Clock::now(), last_log_ = Clock::now(), epoch_start_;
  double elapsed_before_ = 0;    // seconds trained before this process (a resume)
  bool stop_requested_ = false;  // rank > 0: rank 0 reached training.stop_at_accuracy
  int64_t images_since_log_ = 0;
  std::unique_ptr<DataParallel> dp_;  // a data-parallel run's communicator; else null
  // Last, so destroyed first: it waits for a replay still in flight before the buffers go.
  std::unique_ptr<StepGraph> graph_;
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
  raw_copy(m.train_window.data(), Device::CPU, totals_.data(), ex_.device, sizeof(m.train_window));
  try {
    save_checkpoint(path, *net_, opt_.get(), m);
  } catch (const Error& e) {
    CNN_FAIL("step {}: saving the checkpoint failed, the previous one is unchanged: {}",
             pos.global_step, e.what());
  }
  try {
    record_checkpoint_time(ckpt_dir_, file, pos, elapsed());
  } catch (const Error& e) {
    log_->warn("step {}: {} (only a resumed run's time_s is affected)", pos.global_step, e.what());
  }
}

void Trainer::log_point(int64_t epoch) {
  double t[3] = {0, 0, 0};
  raw_copy(t, Device::CPU, totals_.data(), ex_.device, sizeof(t));  // the step's one sync
  totals_.zero(ex_.stream);
  if (t[2] == 0) return;
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
  std::string comm;
  if (dp_) {
    // From the last step's CUDA events (the copy above synchronized): the all-reduce's span and
    // how long the step waited for it after its backward pass (communication not hidden).
    const CommTimes ct = dp_->last_times();
    comm = ct.allreduce_ms < 0
               ? " | all-reduce: no timing"
               : fmt::format(
                     " | all-reduce {:.3f} ms/step, backward waited {:.3f} ms (rank 0's "
                     "shard)",
                     ct.allreduce_ms, ct.exposed_ms);
  }
  log_->step_info("epoch {} step {}: loss {:.4f} acc {:.2f}% lr {:.4g} {:.0f} img/s{}", epoch + 1,
                  pos_.global_step, loss, 100 * acc, lr_, ips, comm);
  log_->metrics({elapsed(), epoch + 1, pos_.global_step, "train", loss, acc, lr_, ips});
}

bool Trainer::claim_folders() {
  CNN_CHECK(args_.resume.empty() || args_.init_weights.empty(),
            "--resume and --init-weights cannot be used together");
  CNN_CHECK(args_.resume.empty() || !args_.overwrite,
            "--overwrite starts a run afresh and --resume continues one; use only one");
  if (!args_.resume.empty()) resume_ckpt_ = resolve_resume_path(args_.resume);
  const std::string& ckpt_in = resume_ckpt_.empty() ? args_.init_weights : resume_ckpt_;
  if (!ckpt_in.empty()) ckpt_meta_ = read_checkpoint_meta(ckpt_in);
  if (!resume_ckpt_.empty()) plan_ = std::make_unique<ResumePlan>(cfg_, ckpt_meta_, resume_ckpt_);
  if (!lead_) {
    // Rank 0 owns the run folder; the others read the same checkpoint and start where it does.
    if (plan_ && plan_->finished()) return false;
    if (plan_) pos_ = ckpt_meta_.position;
    return true;
  }

  RunFolderRequest req;
  req.name = cfg_.name;
  req.logs_root = cfg_.logging.dir;
  req.log_dir = args_.log_dir;
  if (cfg_.checkpoint.dir != cfg_.run_dir()) req.checkpoint_dir = cfg_.checkpoint.dir;
  req.resume = resume_ckpt_;
  req.overwrite = args_.overwrite;
  folders_ = std::make_unique<RunFolders>(req);
  run_dir_ = folders_->run_dir();
  ckpt_dir_ = folders_->ckpt_dir();
  if (plan_ && plan_->finished()) {
    // Nothing is trained, but a write that a kill interrupted at the very end is still tidied.
    for (const std::string& dir : {run_dir_, ckpt_dir_})
      for (const std::string& f : remove_stale_temp_files(dir))
        std::printf("removed %s, left by an interrupted write\n", f.c_str());
    std::printf(
        "%s\n",
        plan_->finished_message(continue_command(args_.program, run_dir_, ckpt_dir_)).c_str());
    return false;
  }
  if (plan_) {
    pos_ = ckpt_meta_.position;
    elapsed_before_ = checkpoint_elapsed(resume_ckpt_, pos_, run_dir_ + "/metrics.csv");
  }
  return true;
}

void Trainer::load_model_and_data() {
  const TrainingOptions& tr = cfg_.training;
  eval_set_ = data_.val.n > 0 ? &data_.val : &data_.test;
  std::vector<float> mean = cfg_.data.mean, stdv = cfg_.data.std;
  const std::string& ckpt_in = resume_ckpt_.empty() ? args_.init_weights : resume_ckpt_;
  if (mean.empty() && !ckpt_in.empty()) {
    mean = ckpt_meta_.mean;
    stdv = ckpt_meta_.std;
  }
  norm_ = resolve_normalization(mean, stdv, data_.train);

  NetworkOptions nopt;
  nopt.max_batch = tr.batch_size;
  nopt.seed = tr.seed;
  nopt = with_env_switches(nopt, env_);
  nopt.label_smoothing = static_cast<float>(tr.label_smoothing);
  // Each step runs one forward_backward, then the update (step_launches_): backward may write
  // the gradients it can instead of adding to them.
  nopt.overwrite_grads = env_.grad_overwrite;
  // A CPU has no second stream for the weight gradients to overlap on, only a scratch to pay.
  nopt.weight_grads_beside = env_.wgrad_beside && ex_.device == Device::CUDA;
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
  if (ckpt_in.empty()) return;
  Checkpoint ck = load_checkpoint_for(ckpt_in, *net_);
  net_->params_from_host(ck.params);
  net_->buffers_from_host(ck.buffers);  // batchnorm's running statistics
  if (resume_ckpt_.empty()) return;
  std::vector<std::string> names;
  for (const auto& [name, values] : ck.optimizer_state) names.push_back(name);
  const std::string note = ResumePlan::check_optimizer_state(cfg_.optimizer, names, resume_ckpt_);
  if (!note.empty()) resume_notes_.push_back(note);
  opt_->state_from_host(ck.optimizer_state, ck.meta.position.global_step);
}

void Trainer::open_run_log() {
  const TrainingOptions& tr = cfg_.training;
  if (!lead_) {
    log_ = std::make_unique<RunLog>(args_.rank.rank);
    autotune_network(*net_, tr.autotune_cache, env_.autotune_cache, kBuildGitHash, *log_);
    return;
  }
  folders_->start_run();
  log_ = std::make_unique<RunLog>(run_dir_, cfg_.logging.progress != ProgressMode::Off);
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir_, ec);
  CNN_CHECK(!ec, "cannot create the checkpoint directory '{}': {}", ckpt_dir_, ec.message());
  for (const std::string& dir : {run_dir_, ckpt_dir_})
    for (const std::string& f : remove_stale_temp_files(dir))
      log_->warn("removed {}, left by an interrupted write", f);
  write_file_atomically(run_dir_ + "/config.yaml", cfg_.resolved_yaml.data(),
                        cfg_.resolved_yaml.size());

  log_->info("run '{}' in {} on {} | precision {} | algo {} | deterministic {} | seed {}",
             cfg_.name, run_dir_, device_description(ex_.device), precision_name(ex_.precision),
             algo_name(tr.algo), tr.deterministic, tr.seed);
  if (ex_.device == Device::CPU && ex_.precision != Precision::FP32)
    log_->info("precision {} selects the GPU's tensor-core math; the CPU computes in fp32",
               precision_name(ex_.precision));
  if (!folders_->note().empty()) log_->info("{}", folders_->note());
  if (std::string why; tr.device == "auto" && ex_.device == Device::CPU && !cuda_available(&why))
    log_->info("device auto chose the CPU: {}", why);
  for (const std::string& note : cfg_.notes) log_->info("config: {}", note);
  log_->info("network (batch {}):\n{}", tr.batch_size,
             format_network_summary(summarize_network(cfg_.model.layers, cfg_.model.input_chw)));
  log_->info("data: train {} images ({}), {} {} images, {} classes, normalization {}",
             data_.train.n, data_.train.source, data_.val.n > 0 ? "validation" : "test",
             eval_set_->n, data_.train.num_classes(), normalization_str(norm_));
  for (const std::string& line : net_->fusion_notes()) log_->info("fusion: {}", line);
  if (const std::vector<std::string> names = net_->overwritten_grad_names(); !names.empty())
    log_->info(
        "gradients written by backward, not added to, and not zeroed by the update: {} "
        "(CNN_GRAD_OVERWRITE=0 adds to them)",
        fmt::join(names, ", "));
  startup_.mark("logs");
  autotune_network(*net_, tr.autotune_cache, env_.autotune_cache, kBuildGitHash, *log_);
  startup_.mark("autotune");
  if (data_.train.skipped > 0)
    log_->warn("skipped {} unreadable training images, e.g. {}", data_.train.skipped,
               data_.train.skipped_examples.empty() ? "" : data_.train.skipped_examples[0]);
  if (!resume_ckpt_.empty())
    log_->info("resuming from {} at epoch {} batch {} (step {}, {:.1f} s trained)", resume_ckpt_,
               pos_.epoch + 1, pos_.batch_in_epoch, pos_.global_step, elapsed_before_);
  for (const std::string& line : resume_notes_) log_->warn("resume: {}", line);
  if (!args_.init_weights.empty()) log_->info("initial weights from {}", args_.init_weights);
  if (dp_)
    log_->info(
        "data-parallel: {}; global batch {} ({} per GPU); rank 0 logs its own shard's "
        "training loss, evaluates and writes checkpoints",
        dp_->describe(), int64_t(tr.batch_size) * tr.gpus, tr.batch_size);
}

void Trainer::prepare_steps() {
  const TrainingOptions& tr = cfg_.training;
  try {
    train_ = std::make_unique<BatchSource>(data_.train, norm_, &cfg_.data.augment, tr.seed,
                                           tr.batch_size, true, cfg_.data.drop_last, ex_, false,
                                           args_.rank.rank, args_.rank.world);
    if (eval_set_->n > 0 && lead_)
      eval_ = std::make_unique<BatchSource>(*eval_set_, norm_, nullptr, tr.seed, tr.batch_size,
                                            false, false, ex_, true);
  } catch (const Error& e) {
    CNN_FAIL("cannot set up the datasets ({} + {} images, batch {}) on {}: {}", data_.train.n,
             eval_set_->n, tr.batch_size, device_name(ex_.device), e.what());
  }
  startup_.mark("dataset upload");
  totals_ = Buffer<double>(3, ex_.device);
  // A resume continues the window of training rows that its checkpoint was taken in.
  if (resume_ckpt_.empty())
    totals_.zero(ex_.stream);
  else
    totals_.copy_from(ckpt_meta_.train_window.data(), Device::CPU, 3, ex_.stream);
  // A fresh run starts metrics.csv afresh; a resume drops the rows past its checkpoint, and those
  // at its step that it writes again: the evaluation when the checkpoint was taken on an epoch's
  // last batch, the train row when the checkpoint holds an open window.
  log_->truncate_metrics_after(pos_.global_step, pos_.batch_in_epoch < steps_per_epoch_,
                               resume_ckpt_.empty() || ckpt_meta_.train_window[2] == 0);
  lr_ = cfg_.optimizer.lr;
  // A step's launches: all that changes between steps is read from `state` on the device, so
  // the same launches (captured once as a CUDA graph) serve every full batch.
  const std::string graph_off =
      cuda_graph_off_reason(ex_.device, tr.cuda_graph, opt_->syncs_host());
  log_->info("CUDA graph: {}", graph_off.empty()
                                   ? "on (the training step is captured after one plain step, "
                                     "then replayed once per full batch)"
                                   : "off (" + graph_off + ")");
  state_ = std::make_unique<StepState>(ex_, steps_per_epoch_);
  train_->use_batch_counter(state_->batch());
  net_->set_step_counter(state_->update());  // dropout's masks move with the graph's step
  graph_ = std::make_unique<StepGraph>(ex_, graph_off.empty(), read_env_switches().graph_overlap);
  startup_.expect_graph(graph_off.empty());
  if (dp_) {
    dp_->attach(*net_, ex_, kGradBucketBytes);
    if (lead_) log_->info("data-parallel: {} gradient bucket(s)", dp_->num_buckets());
  }
  if (ex_.device == Device::CUDA)
    log_->info("backward: convolutions' and linear layers' weight gradients {}",
               env_.wgrad_beside ? "on a second stream beside their input gradients"
                                 : "in turn on one stream (CNN_WGRAD_BESIDE=0)");
  if (env_.early_update) {
    const std::string why = opt_->enable_early_updates();  // after dp_'s hook, which it refuses
    if (why.empty())
      log_->info(
          "optimizer: early updates (CNN_EARLY_UPDATE=1): each range of at least {} parameters "
          "is updated as soon as backward has finished its gradients{}",
          ParamOptimizer::kEarlyUpdateMinElems,
          ex_.device == Device::CUDA ? ", on a second stream beside the rest of backward" : "");
    else
      log_->info("optimizer: no early updates (CNN_EARLY_UPDATE=1): {}", why);
  }
  step_launches_ = [this] {
    train_->gather(n_);
    opt_->begin_step_from(state_->lr(), state_->update());
    // Each rank's gradient is its slice's sum over the global batch's size, so that the ranks'
    // sum (the all-reduce) is the global batch's mean: one process at batch gpus * batch_size.
    // A rank past the end of a final partial batch computes nothing but joins the all-reduce,
    // with zeros: the update left the overwritten gradients holding the step before's.
    if (n_ > 0)
      net_->forward_backward(n_, train_->x(), train_->labels(), 1.0f / float(global_n_));
    else if (!net_->overwritten_grad_ranges().empty())
      net_->zero_grads();
    if (dp_) dp_->finish_step();
    if (n_ > 0)
      accumulate_metrics(n_, net_->loss_rows(), net_->predictions(), train_->labels(),
                         totals_.data(), ex_);
    opt_->step_from(state_->lr(), state_->update());
    state_->advance();
  };
}

EpochEnd Trainer::run_epoch(int64_t epoch) {
  const TrainingOptions& tr = cfg_.training;
  BatchSource& train = *train_;
  epoch_start_ = Clock::now();
  train.start_epoch(epoch, epoch == pos_.epoch ? pos_.batch_in_epoch : 0);
  pos_.epoch = epoch;
  // The schedule follows the fractional epoch (batch k at (epoch * steps + k) / steps, also after
  // a resume inside the epoch or one that changed the batch size); the optimizer's update number
  // is the global step after the update.
  state_->start_epoch(epoch_lr_table(cfg_.schedule, cfg_.optimizer.lr, epoch * steps_per_epoch_,
                                     steps_per_epoch_, tr.epochs),
                      train.position(), pos_.global_step + 1);
  for (;;) {
    const int64_t batch_index = train.position();
    if (!train.take(&n_)) return EpochEnd::Done;
    global_n_ = train.last_global_count();
    lr_ = state_->lr_at(batch_index);
    // A captured step bakes in the full global batch (its gradient scale).
    graph_->run(step_launches_, global_n_ == int64_t(tr.batch_size) * tr.gpus);
    if (dp_) dp_->watch_step();
    if (!startup_.reported()) startup_.after_step(ex_, *log_);
    bool warning = false;
    if (const std::string news = graph_->take_news(&warning); !news.empty()) {
      if (warning)
        log_->warn("step {}: {}", pos_.global_step + 1, news);
      else
        log_->info("step {}: {}", pos_.global_step + 1, news);
    }
    ++pos_.global_step;
    pos_.batch_in_epoch = train.position();
    images_since_log_ += global_n_;
    if (!lead_) {
      if (tr.max_steps > 0 && pos_.global_step >= tr.max_steps) return EpochEnd::MaxSteps;
      continue;
    }
    const bool log_now =
        cfg_.logging.every_steps > 0 && pos_.global_step % cfg_.logging.every_steps == 0;
    const bool save_now =
        cfg_.checkpoint.every_steps > 0 && pos_.global_step % cfg_.checkpoint.every_steps == 0;
    if (dp_ && (log_now || save_now || g_stop_signal)) dp_->drain();
    if (log_now) log_point(epoch);
    const double epoch_s = seconds_since(epoch_start_);
    log_->progress(epoch, tr.epochs, pos_.batch_in_epoch, steps_per_epoch_, lr_,
                   epoch_s / double(std::max<int64_t>(1, pos_.batch_in_epoch)) *
                       double(steps_per_epoch_ - pos_.batch_in_epoch));
    if (save_now) save("last.safetensors", pos_);
    if (g_stop_signal) return EpochEnd::Signal;
    if (tr.max_steps > 0 && pos_.global_step >= tr.max_steps) return EpochEnd::MaxSteps;
  }
}

void Trainer::evaluate_epoch(int64_t epoch, double train_s, bool last_epoch, TrainPosition* next) {
  const char* split = data_.val.n > 0 ? "validation" : "test";
  const auto eval_start = Clock::now();
  const EvalResult r = evaluate(*net_, *eval_, cfg_.training.eval_flip);
  const double eval_s = seconds_since(eval_start);
  log_->info(
      "epoch {} {}: loss {:.4f} accuracy {:.2f}% ({} images) | epoch time {:.2f} s "
      "(train {:.2f} s, eval {:.2f} s), {:.1f} s elapsed",
      epoch + 1, split, r.loss, 100 * r.accuracy, r.count, train_s + eval_s, train_s, eval_s,
      elapsed());
  log_->metrics({elapsed(), epoch + 1, pos_.global_step, "eval", r.loss, r.accuracy, lr_, 0});
  CNN_CHECK(std::isfinite(r.loss), "epoch {}: the evaluation loss is {}; stopping", epoch + 1,
            r.loss);
  if (target_.reached_now(epoch + 1, pos_.global_step, r.accuracy))
    last_epoch = true;  // training.stop_at_accuracy
  // Written before the final checkpoint: a run killed after that checkpoint is complete, as a
  // resume from it has nothing left to run.
  if (last_epoch) {
    log_->info("confusion matrix ({}):\n{}", split, format_confusion(r, data_.train.class_names));
    const std::string csv = confusion_csv(r, data_.train.class_names);
    write_file_atomically(run_dir_ + "/confusion.csv", csv.data(), csv.size());
  }
  if (r.accuracy > next->best_accuracy) {
    next->best_accuracy = r.accuracy;
    if (cfg_.checkpoint.keep_best) save("best.safetensors", *next);
  }
}

void Trainer::end_of_epoch(int64_t epoch, bool stopped) {
  const TrainingOptions& tr = cfg_.training;
  if (dp_) dp_->drain();
  if (lead_) log_point(epoch);
  stream_sync(ex_.device, ex_.stream);
  const double train_s = seconds_since(epoch_start_);
  TrainPosition next = pos_;
  if (!stopped || pos_.batch_in_epoch >= steps_per_epoch_) {
    next.epoch = epoch + 1;
    next.batch_in_epoch = 0;
  }
  const bool last_epoch = epoch + 1 == tr.epochs || stopped;
  const bool eval_due = epoch + 1 >= tr.eval_from_epoch && (epoch + 1) % tr.eval_every_epochs == 0;
  if (eval_ && (eval_due || last_epoch)) evaluate_epoch(epoch, train_s, last_epoch, &next);
  pos_ = next;
  if (dp_) share_stop_decision();
  if (!lead_) return;
  if ((cfg_.checkpoint.every_epochs > 0 && (epoch + 1) % cfg_.checkpoint.every_epochs == 0) ||
      last_epoch || target_.reached())
    save("last.safetensors", pos_);
}

void Trainer::share_stop_decision() {
  Buffer<float> flag(1, ex_.device);
  const float mine = lead_ && target_.reached() ? 1.0f : 0.0f;
  flag.copy_from(&mine, Device::CPU, 1, ex_.stream);
  dp_->all_reduce_sum(flag.data(), 1);
  float sum = 0;
  raw_copy(&sum, Device::CPU, flag.data(), ex_.device, sizeof(sum));  // syncs the stream
  if (sum > 0 && !lead_) stop_requested_ = true;
}

int Trainer::stop_by_signal(int sig) {
  log_->clear_bar();
  save("last.safetensors", pos_);
  log_->info("stopped by {} at epoch {} step {}; checkpoint {}/last.safetensors. Continue with: {}",
             sig == SIGINT ? "SIGINT" : "SIGTERM", pos_.epoch + 1, pos_.global_step, ckpt_dir_,
             continue_command(args_.program, run_dir_, ckpt_dir_));
  return 128 + sig;
}

void Trainer::finish() {
  EndSummaryInput in;
  in.metrics_csv = log_->metrics_path();
  in.run_dir = run_dir_;
  in.ckpt_dir = ckpt_dir_;
  in.resume_command = continue_command(args_.program, run_dir_, ckpt_dir_);
  in.eval_name = data_.val.n > 0 ? "validation" : "test";
  in.epochs = cfg_.training.epochs;
  in.steps = pos_.global_step;
  in.seconds = elapsed();
  in.target = target_.summary();
  std::string text = format_end_summary(in);
  text.pop_back();
  log_->info("{}", text);
  target_.write_run_json(run_dir_, cfg_, pos_.epoch, pos_.global_step,
                         std::max(0.0, pos_.best_accuracy));
}

int Trainer::run() {
  const TrainingOptions& tr = cfg_.training;
  startup_.mark("config");
  check_data_options(cfg_.data);  // before a run folder is made for a run that cannot load data
  if (!claim_folders()) return 0;
  startup_.mark("run folder");
  DataOptions data_opt = cfg_.data;
  data_opt.decoded_cache = env_.data_cache;
  if (args_.rank.distributed()) {
    // A rank selects its GPU (DataParallel) before anything creates a CUDA context, so the
    // context is not opened on another thread (which would open it on GPU 0).
    data_ = load_data(data_opt);
    startup_.mark("dataset decode");
    RankInfo info = args_.rank;
    if (info.id_file.empty())  // mpirun: a file in the logs folder, which all ranks must share
      info.id_file = cfg_.logging.dir + "/" + cfg_.name + ".nccl-id";
    dp_ = std::make_unique<DataParallel>(info, tr.nccl_library, tr.deterministic,
                                         env_.nccl_timeout_s);
    ex_.device = open_device(tr.device);
    CNN_CHECK(ex_.device == Device::CUDA,
              "rank {} of {}: multi-GPU training needs a GPU (training.device is {}, which "
              "resolved to the CPU)",
              args_.rank.rank, args_.rank.world, tr.device);
  } else {
    // Creating the CUDA context is most of the start-up (0.23 s of 0.39 on the H200, measured
    // from train.log's start-up line); it needs nothing from the dataset, so a thread of its own
    // creates it while this one decodes the dataset.
    std::future<Device> device =
        std::async(std::launch::async, [name = tr.device] { return open_device(name); });
    data_ = load_data(data_opt);
    startup_.mark("dataset decode");
    ex_.device = device.get();
  }
  ex_.precision = tr.precision;
  ex_.deterministic = tr.deterministic;
  stream_ = std::make_unique<TrainStream>(ex_.device);
  ex_.stream = stream_->get();
  startup_.mark("CUDA context wait");
  load_model_and_data();
  startup_.mark("network");
  {
    // The number of steps per epoch is the sampler's; known once the data is.
    const BatchSampler probe(data_.train.n, tr.batch_size, true, cfg_.data.drop_last, tr.seed,
                             args_.rank.rank, args_.rank.world);
    steps_per_epoch_ = probe.batches_per_epoch();
  }
  CNN_CHECK(steps_per_epoch_ > 0, "the training set ({} images) gives no batch of {} (drop_last)",
            data_.train.n, tr.batch_size);
  if (plan_) {
    const std::vector<std::string> changes = plan_->change_notes(steps_per_epoch_);
    resume_notes_.insert(resume_notes_.begin(), changes.begin(), changes.end());
  }
  open_run_log();
  prepare_steps();

  // Ranks other than 0 leave SIGINT (a terminal's Ctrl-C reaches every rank) to rank 0, which
  // saves the checkpoint; the launcher then stops them with SIGTERM.
  std::optional<StopSignalScope> stop_signals;
  if (lead_)
    stop_signals.emplace();
  else
    std::signal(SIGINT, SIG_IGN);
  for (int64_t epoch = pos_.epoch; epoch < tr.epochs; ++epoch) {
    const EpochEnd how = run_epoch(epoch);
    if (how == EpochEnd::Signal) return stop_by_signal(int(g_stop_signal));
    end_of_epoch(epoch, how == EpochEnd::MaxSteps);
    if (how == EpochEnd::MaxSteps || target_.reached() || stop_requested_) break;
  }
  if (dp_) stream_sync(ex_.device, ex_.stream);
  if (lead_) finish();
  return 0;
}

}  // namespace

int run_training(const TrainConfig& cfg, const TrainArgs& args) {
  return Trainer(cfg, args).run();
}

int run_check_data(const TrainConfig& cfg) {
  int64_t problems = 0;
  DataOptions data_opt = cfg.data;
  data_opt.decoded_cache = read_env_switches().data_cache;
  std::printf("%s", check_data_report(data_opt, &problems).c_str());
  return problems ? 1 : 0;
}

}  // namespace cnn
