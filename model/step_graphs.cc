#include "model/step_graphs.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <exception>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/layout_key.h"

namespace praxis::model {
namespace {

using c10::cuda::CUDACachingAllocator::getDeviceStats;

int64_t ReservedBytes(int device) {
  return getDeviceStats(device)
      .reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

// Calls `f`, swallowing a LibTorch error: for cleanup steps that may already have happened.
template <typename F>
void BestEffort(F f) {
  try {
    f();
  } catch (const std::exception&) {
  }
}

// Returns the stream and the allocators to normal after a capture that threw part-way (PyTorch's
// CUDAGraph leaves that to its caller): ends the capture if the stream still records, stops
// routing allocations to the graph's pool, and releases the pool.
void AbandonCapture(const c10::cuda::CUDAStream& stream, int device, c10::MempoolId_t pool) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(stream.stream(), &g);
    if (g != nullptr) (void)cudaGraphDestroy(g);
  }
  BestEffort([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool); });
  BestEffort([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
  BestEffort([&] { c10::cuda::CUDACachingAllocator::releasePool(device, pool); });
  BestEffort([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
  (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
}

// Makes `waiter`'s later work wait for everything queued on `on` so far (no host wait).
void WaitFor(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  c10::cuda::CUDAEvent done;
  done.record(on);
  done.block(waiter);
}

// The static buffers of `batch`: fresh device tensors (never the caller's) and pinned staging.
void AllocateBuffers(const StepInputs& batch, int device, CapturedStep& s) {
  s.inputs = batch;
  s.staging = batch;
  s.staged = std::make_unique<c10::cuda::CUDAEvent>();
  for (const wire::InputField& field : wire::kInputFields) {
    const torch::Tensor& t = batch.*field.tensor;
    if (!t.defined()) continue;
    const torch::Tensor host = t.cpu();
    s.staging.*field.tensor = torch::empty(host.sizes(), host.options().pinned_memory(true));
    s.inputs.*field.tensor = host.to(torch::Device(torch::kCUDA, device)).clone();
    s.bytes += (s.inputs.*field.tensor).nbytes();
  }
}

}  // namespace

// Streams made once: a pool stream per capture would strand each warm-up's cached memory, and a
// cuBLAS workspace, on a stream of its own.
struct StepGraphs::Streams {
  c10::cuda::CUDAStream capture;
  c10::cuda::CUDAStream copy;
};

CapturedStep::CapturedStep() = default;
CapturedStep::CapturedStep(CapturedStep&&) noexcept = default;
CapturedStep::~CapturedStep() = default;

StepGraphs::StepGraphs(VideoBackbone& model, int64_t max_bytes)
    : model_(model),
      device_(model.options().device.has_index() ? model.options().device.index()
                                                 : c10::cuda::current_device()),
      streams_(new Streams{c10::cuda::getStreamFromPool(false, device_),
                           c10::cuda::getStreamFromPool(false, device_)}),
      cache_("a CUDA graph", /*max_entries=*/1 << 20, max_bytes) {}

StepGraphs::~StepGraphs() = default;

void StepGraphs::CaptureInto(CapturedStep& s) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
  const c10::cuda::CUDAStream& stream = streams_->capture;
  const c10::cuda::CUDAStreamGuard on_stream(stream);
  // One eager run on the capture stream first, as PyTorch's make_graphed_callables does: lazy
  // initialisation (cuBLAS handles and workspaces, kernel selection) must not happen in capture.
  WaitFor(stream, current);
  model_.RunPlanned(s.inputs, *s.plan);
  stream.synchronize();
  // The allocator cannot free cached blocks while a capture is under way: free them now (this
  // also makes the pool's byte count below exact).
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t before = ReservedBytes(device_);
  const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  auto graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
  try {
    graph->capture_begin(pool, cudaStreamCaptureModeGlobal);
    s.outputs = model_.RunPlanned(s.inputs, *s.plan);
    graph->capture_end();
  } catch (...) {
    s.outputs = BackboneOutput();
    AbandonCapture(stream, device_, pool);
    throw;
  }
  // Apart from the capture: if instantiating throws, the graph's own reset releases its pool once.
  graph->instantiate();
  s.bytes += ReservedBytes(device_) - before + s.plan->nbytes();
  s.graph = std::move(graph);
}

absl::StatusOr<CapturedStep> StepGraphs::Build(const StepInputs& batch) {
  CapturedStep s;
  PRAXIS_ASSIGN_OR_RETURN(s.plan, model_.PlanLayout(batch));
  const c10::cuda::CUDAGuard device_guard(device_);
  const std::string what = absl::StrCat("CUDA graph capture of layout ", wire::LayoutKey(batch),
                                        " x ", batch.noised.size(0), " rows");
  try {
    AllocateBuffers(batch, device_, s);
    CaptureInto(s);
    if (s.bytes > cache_.max_bytes()) {
      // Held, it would be the cache's only entry and evict every other graph, then be evicted by
      // the next (layout, rows) and captured again: a thrash measured on an H200 (a bench-layout
      // graph of the reduced Praxis-1 model is 10.5 GB). Such steps are long enough that a graph
      // saves little (1-2 % there): drop it, return its pool to the device, and run eagerly.
      const int64_t needed = s.bytes;
      Discard(s);
      c10::cuda::CUDACachingAllocator::emptyCache();
      s.failure = absl::StrCat("its graph needs ", needed,
                               " device bytes, over --cuda_graph_bytes (", cache_.max_bytes(), ")");
      ++over_budget_;
      std::cerr << "praxis-server: " << what << " runs eagerly: " << s.failure << std::endl;
    }
  } catch (const std::exception& e) {
    // Out of device memory too: cached like any failure, or every batch of that (layout, rows)
    // would pay an eager warm-up and a failing capture before its own eager step.
    Discard(s);
    c10::cuda::CUDACachingAllocator::emptyCache();
    s.failure = e.what();
    ++capture_failures_;
    std::cerr << "praxis-server: " << what
              << " failed; it runs eagerly: " << s.failure.substr(0, s.failure.find('\n'))
              << std::endl;
  }
  return s;
}

void StepGraphs::Discard(CapturedStep& s) {
  s.outputs = BackboneOutput();  // before the graph: they live in its pool
  s.graph.reset();
  s.inputs = s.staging = StepInputs();
  s.staged.reset();
  s.bytes = 0;
}

absl::StatusOr<std::shared_ptr<const CapturedStep>> StepGraphs::Get(const StepInputs& batch) {
  const std::string key = absl::StrCat(wire::LayoutKey(batch), " x", batch.noised.size(0));
  return cache_.Get(key, [&] { return Build(batch); });
}

absl::Status StepGraphs::Capture(const StepInputs& batch) {
  PRAXIS_ASSIGN_OR_RETURN(const std::shared_ptr<const CapturedStep> s, Get(batch));
  if (s->graph == nullptr) {
    return absl::InternalError(absl::StrCat("no CUDA graph, the step runs eagerly: ", s->failure));
  }
  return absl::OkStatus();
}

void StepGraphs::Stage(const StepInputs& batch, const CapturedStep& s) {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_);
  const c10::cuda::CUDAStream& copy = streams_->copy;
  {
    const c10::cuda::CUDAStreamGuard on_copy(copy);
    s.staged->synchronize();  // the last copies out of the staging buffers are done
    WaitFor(copy, compute);   // and the last replay has read the static inputs
    for (const wire::InputField& field : wire::kInputFields) {
      const torch::Tensor& t = batch.*field.tensor;
      if (!t.defined()) continue;
      const torch::Tensor& staging = s.staging.*field.tensor;
      staging.copy_(t);
      (s.inputs.*field.tensor).copy_(staging, /*non_blocking=*/true);
    }
    s.staged->record(copy);
  }
  WaitFor(compute, copy);
}

absl::StatusOr<BackboneOutput> StepGraphs::Run(const StepInputs& batch) {
  absl::StatusOr<std::shared_ptr<const CapturedStep>> got = Get(batch);
  PRAXIS_RETURN_IF_ERROR(got.status());
  const CapturedStep& s = **got;
  if (s.graph == nullptr) return model_.ForwardPlanned(batch, *s.plan);
  try {
    const c10::cuda::CUDAGuard device_guard(device_);
    Stage(batch, s);
    s.graph->replay();
    return s.outputs;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("replaying the CUDA graph failed: ", e.what()));
  }
}

GraphStats StepGraphs::stats() const {
  return {cache_.stats(), capture_failures_.load(), over_budget_.load()};
}

}  // namespace praxis::model
