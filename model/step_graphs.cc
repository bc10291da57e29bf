#include "model/step_graphs.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/layout_key.h"

namespace praxis::model {
namespace {

using c10::cuda::CUDACachingAllocator::getDeviceStats;

int64_t ReservedBytes(c10::DeviceIndex device) {
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
void AbandonCapture(const c10::cuda::CUDAStream& stream, c10::DeviceIndex device,
                    c10::MempoolId_t pool) {
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
  at::cuda::CUDAEvent done;
  done.record(on);
  done.block(waiter);
}

// The static buffers of `batch`: fresh device tensors (never the caller's) and pinned staging.
void AllocateBuffers(const StepInputs& batch, torch::Device device, CapturedStep& s) {
  s.inputs = batch;
  s.staging = batch;
  for (const wire::InputField& field : wire::kInputFields) {
    const torch::Tensor& t = batch.*field.tensor;
    if (!t.defined()) continue;
    const torch::Tensor host = t.cpu();
    s.staging.*field.tensor = torch::empty(host.sizes(), host.options().pinned_memory(true));
    s.inputs.*field.tensor = host.to(device).clone();
    s.bytes += (s.inputs.*field.tensor).nbytes();
  }
}

}  // namespace

CapturedStep::CapturedStep() = default;
CapturedStep::CapturedStep(CapturedStep&&) noexcept = default;
CapturedStep::~CapturedStep() = default;

StepGraphs::StepGraphs(VideoBackbone& model, int64_t max_bytes)
    : model_(model), cache_("a CUDA graph", /*max_entries=*/1 << 20, max_bytes) {}

absl::StatusOr<CapturedStep> StepGraphs::Build(const StepInputs& batch) {
  CapturedStep s;
  PRAXIS_ASSIGN_OR_RETURN(s.plan, model_.PlanLayout(batch));
  const torch::Device device = model_.options().device;
  const c10::cuda::CUDAGuard device_guard(device);
  AllocateBuffers(batch, device, s);
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  bool capturing = false;
  try {
    const c10::cuda::CUDAStreamGuard on_stream(stream);
    // One eager run on the capture stream first, as PyTorch's make_graphed_callables does: lazy
    // initialisation (cuBLAS handles and workspaces, kernel selection) must not happen in capture.
    WaitFor(stream, c10::cuda::getDefaultCUDAStream(device.index()));
    model_.RunPlanned(s.inputs, s.plan);
    stream.synchronize();
    const int64_t before = ReservedBytes(device.index());
    capturing = true;
    graph->capture_begin(pool, cudaStreamCaptureModeGlobal);
    s.outputs = model_.RunPlanned(s.inputs, s.plan);
    graph->capture_end();
    capturing = false;
    s.bytes += ReservedBytes(device.index()) - before;
    s.graph = std::move(graph);
  } catch (const std::exception& e) {
    if (capturing) AbandonCapture(stream, device.index(), pool);
    s.outputs = BackboneOutput();
    s.failure = e.what();
    ++capture_failures_;
    std::cerr << "praxis-server: CUDA graph capture of layout " << wire::LayoutKey(batch)
              << " x " << batch.noised.size(0) << " rows failed; it runs eagerly: "
              << s.failure.substr(0, s.failure.find('\n')) << std::endl;
  }
  return s;
}

absl::StatusOr<std::shared_ptr<const CapturedStep>> StepGraphs::Get(const StepInputs& batch) {
  const std::string key = absl::StrCat(wire::LayoutKey(batch), " x", batch.noised.size(0));
  return cache_.Get(key, [&] { return Build(batch); });
}

absl::Status StepGraphs::Capture(const StepInputs& batch) {
  PRAXIS_ASSIGN_OR_RETURN(const std::shared_ptr<const CapturedStep> s, Get(batch));
  if (s->graph == nullptr) {
    return absl::InternalError(absl::StrCat("CUDA graph capture failed: ", s->failure));
  }
  return absl::OkStatus();
}

absl::StatusOr<BackboneOutput> StepGraphs::Run(const StepInputs& batch) {
  PRAXIS_ASSIGN_OR_RETURN(const std::shared_ptr<const CapturedStep> s, Get(batch));
  if (s->graph == nullptr) return model_.ForwardValidated(batch);
  try {
    const torch::Device device = model_.options().device;
    const c10::cuda::CUDAGuard device_guard(device);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
    const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, device.index());
    {
      // Staging buffers are free: the previous Run's copies finished before its outputs came back.
      const c10::cuda::CUDAStreamGuard on_copy(copy);
      WaitFor(copy, compute);  // the last replay has read its inputs
      for (const wire::InputField& field : wire::kInputFields) {
        const torch::Tensor& t = batch.*field.tensor;
        if (!t.defined()) continue;
        torch::Tensor staging = s->staging.*field.tensor;
        staging.copy_(t);
        (s->inputs.*field.tensor).copy_(staging, /*non_blocking=*/true);
      }
    }
    WaitFor(compute, copy);
    s->graph->replay();
    BackboneOutput out = s->outputs;
    out.features.positions = s->plan.positions.unsqueeze(0).expand({batch.noised.size(0), -1});
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("replaying the CUDA graph failed: ", e.what()));
  }
}

GraphStats StepGraphs::stats() const { return {cache_.stats(), capture_failures_.load()}; }

}  // namespace praxis::model
