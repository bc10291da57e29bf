#pragma once

// CUDA graphs of the forward, one per (layout key, batch rows): a denoising step of a layout seen
// before is one graph launch instead of a few thousand kernel launches from the host.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/shared_lru_cache.h"
#include "model/backbone.h"

namespace at::cuda {
struct CUDAGraph;
}  // namespace at::cuda
namespace c10::cuda {
struct CUDAEvent;
}  // namespace c10::cuda

namespace praxis::model {

// One captured forward: the static device inputs the graph reads, the pinned host buffers they
// are staged through (and the event of the last copy out of them), the outputs the graph writes
// (overwritten by every replay) and the layout's plan. `graph` is null when the capture failed:
// the layout then runs eagerly on the plan, and `failure` says why (cached too, holding no
// buffers, so that a layout that cannot be captured is not tried again at every batch).
struct CapturedStep {
  CapturedStep();
  CapturedStep(CapturedStep&&) noexcept;
  ~CapturedStep();

  std::shared_ptr<const LayoutPlan> plan;
  StepInputs inputs;                             // on the device
  StepInputs staging;                            // pinned host tensors of the same shapes
  std::unique_ptr<c10::cuda::CUDAEvent> staged;  // recorded after the copies out of `staging`
  BackboneOutput outputs;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::string failure;
  // Bytes it holds: the static inputs, the graph's memory pool and its plan (LayoutPlan::nbytes).
  int64_t bytes = 0;

  int64_t nbytes() const { return bytes; }
};

// Counters of the graph cache, the captures that failed and those whose graph alone was over the
// byte bound (both kinds of (layout, rows) run eagerly).
struct GraphStats {
  CacheStats cache;
  int64_t capture_failures = 0;
  int64_t over_budget = 0;
};

// Runs a VideoBackbone on CUDA through captured graphs, capturing each (layout key, rows) on first
// use and keeping the captures in a SharedLruCache bounded by device bytes. Captures in
// cudaStreamCaptureModeGlobal, where any host synchronisation fails the capture: a capture that
// succeeds is the proof that the forward never waits on the device. A capture that fails is
// logged once (stderr) and its layout falls back to the eager forward (one that ran out of device
// memory too, rather than trying again at every batch). A graph that alone holds more than
// `max_bytes` is dropped after its capture and its (layout, rows) cached as eager, so that one
// huge step cannot evict every other graph at each of its batches.
// Not thread-safe: one batcher worker runs it (the replayed buffers are shared); stats() may be
// called from any thread. The model, on a CUDA device, must outlive it.
class StepGraphs {
 public:
  StepGraphs(VideoBackbone& model, int64_t max_bytes);
  ~StepGraphs();

  // One step of validated host inputs `batch`: copies them into the graph's static inputs
  // (through pinned memory, on a copy stream the compute stream waits for), replays, and returns
  // the outputs still on the device — valid until the next Run, which the caller must not start
  // before it has read them. Internal for a LibTorch failure.
  absl::StatusOr<BackboneOutput> Run(const StepInputs& batch);

  // Captures the graph of `batch`'s layout and rows now (warm-up, before health says SERVING);
  // the reason when there is no graph (a failed capture, or one over the byte bound), which Run
  // would have logged and run eagerly.
  absl::Status Capture(const StepInputs& batch);

  GraphStats stats() const;

 private:
  // The cached capture of `batch`'s (layout key, rows), capturing it on a miss.
  absl::StatusOr<std::shared_ptr<const CapturedStep>> Get(const StepInputs& batch);
  // Stages, warms up and captures one forward of `batch`; a CapturedStep with a null graph and
  // the reason when capturing throws or its graph alone is over the byte bound.
  absl::StatusOr<CapturedStep> Build(const StepInputs& batch);
  // Warms up on the capture stream and captures `s`'s forward into `s.graph`; throws on failure,
  // with the stream and the allocator back to normal.
  void CaptureInto(CapturedStep& s);
  // Frees what `s` holds on the device (its outputs before the graph whose pool they live in),
  // leaving its plan: the entry of a (layout, rows) that runs eagerly.
  static void Discard(CapturedStep& s);
  // Copies `batch` into `s`'s static inputs through its staging buffers, on the copy stream that
  // the current stream then waits for.
  void Stage(const StepInputs& batch, const CapturedStep& s);

  struct Streams;  // the capture and copy streams, made once (model/step_graphs.cc)

  VideoBackbone& model_;
  const int device_;  // the CUDA device index
  std::unique_ptr<Streams> streams_;
  SharedLruCache<std::string, CapturedStep> cache_;
  std::atomic<int64_t> capture_failures_{0};
  std::atomic<int64_t> over_budget_{0};
};

}  // namespace praxis::model
