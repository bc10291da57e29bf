#pragma once

// The model as the server sees it (STYLE.md: server/ sees this interface; only main.cc names the
// LibTorch implementation).

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/cpu_runtime.h"
#include "model/mask_cache.h"
#include "model/step.h"
#include "model/step_graphs.h"

namespace praxis::model {

// StepRunner::intra_op_threads's answer.
struct IntraOpThreads {
  int threads = 0;       // of the last run
  int64_t switches = 0;  // changes of the count (IntraOpThreadChooser) since start
};

// Runs one stacked batch of validated steps and describes the model. Thread-safe: the batcher's
// workers may run batches at once (on a CPU, each on its share of the cores), and the const
// accessors are called from any thread (metrics scrapes, model-info calls).
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const BackboneConfig& config() const = 0;
  // One step over all rows of `batch`: the outputs `wanted` selects, on the host; the others
  // undefined (never copied off the device or converted). Every step stacked into `batch` must
  // have passed ValidateStep (the server checks each request before queueing); the LibTorch
  // runner does not check again. Internal for a runtime failure; an implementation that checks
  // anyway may return InvalidArgument.
  // `shares` > 1: the batch runs beside others on the same machine (the batcher's workers sharing
  // the CPU's cores), on one intra-op thread; ignored on CUDA.
  absl::StatusOr<BackboneOutput> Run(const StepInputs& batch, const OutputSelection& wanted,
                                     int shares = 1) {
    return RunOnShare(batch, wanted, shares);
  }
  virtual MaskCacheStats mask_cache_stats() const = 0;
  // The text cache's counters (model/text_cache.h); all zero where there is none.
  virtual CacheStats text_cache_stats() const { return {}; }
  virtual std::string device() const = 0;  // "cpu", "cuda:0"
  virtual std::string dtype() const = 0;   // "float32", "bfloat16", "float16"
  // Bytes the device allocator holds now; nullopt where the device keeps no such count (CPU).
  virtual std::optional<int64_t> device_memory_bytes() const = 0;
  // The CUDA-graph cache's counters; nullopt where steps run eagerly (CPU, --cuda_graphs=false).
  virtual std::optional<GraphStats> graph_stats() const { return std::nullopt; }
  // The intra-op threads of the last CPU run and how often the count changed; nullopt on CUDA
  // or where the runner leaves the worker's count as it is.
  virtual std::optional<IntraOpThreads> intra_op_threads() const { return std::nullopt; }

 protected:
  // Run's work; shares >= 1.
  virtual absl::StatusOr<BackboneOutput> RunOnShare(const StepInputs& batch,
                                                    const OutputSelection& wanted, int shares) = 0;
};

// How BackboneStepRunner runs its model.
struct RunnerOptions {
  // > 0: Run sets its thread's LibTorch intra-op threads to it (model/cpu_runtime.h), or on the
  // CPU to the count thread_probe_every chooses; 0 leaves every thread's count as it is.
  int intra_op_threads = 0;
  // On the CPU with intra_op_threads >= 2, > 0: each run takes the count between 1 and
  // intra_op_threads that ran fastest, timing a neighbouring count after each probe_every of runs
  // (IntraOpThreadChooser, model/cpu_runtime.h); 0 always takes intra_op_threads.
  absl::Duration thread_probe_every = absl::Seconds(2);
  // On CUDA, replay a captured graph per (layout key, rows) (model/step_graphs.h), keeping at
  // most this many device bytes of them; 0 runs every step eagerly. Ignored on the CPU.
  int64_t cuda_graph_bytes = int64_t{8} << 30;
};

// The LibTorch StepRunner over a VideoBackbone: Run is VideoBackbone::ForwardValidated (inputs
// go to the device once, through pinned host memory on CUDA) or, on CUDA, the replay of the
// layout's captured graph; the wanted outputs come back to the host (on CUDA: into pinned memory,
// one stream synchronisation per batch).
class BackboneStepRunner : public StepRunner {
 public:
  explicit BackboneStepRunner(std::unique_ptr<VideoBackbone> model, RunnerOptions options = {});

  const BackboneConfig& config() const override { return model_->config(); }
  MaskCacheStats mask_cache_stats() const override { return model_->mask_cache().stats(); }
  CacheStats text_cache_stats() const override { return model_->text_cache_stats(); }
  std::string device() const override;
  std::string dtype() const override;
  std::optional<int64_t> device_memory_bytes() const override;
  std::optional<GraphStats> graph_stats() const override;
  std::optional<IntraOpThreads> intra_op_threads() const override;

 protected:
  absl::StatusOr<BackboneOutput> RunOnShare(const StepInputs& batch, const OutputSelection& wanted,
                                            int shares) override;

 private:
  std::unique_ptr<VideoBackbone> model_;
  const int intra_op_threads_;
  std::unique_ptr<StepGraphs> graphs_;             // null: eager
  // Null: always intra_op_threads_. Guarded: the batcher's workers share it (only batches run
  // alone take and time its count) and metrics scrapes read its switches.
  mutable absl::Mutex chooser_mu_;
  std::unique_ptr<IntraOpThreadChooser> chooser_ ABSL_PT_GUARDED_BY(chooser_mu_);
  std::atomic<int> last_threads_{0};               // of the last CPU run; 0 before one
};

}  // namespace praxis::model
