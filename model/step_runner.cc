#include "model/step_runner.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <utility>

#include "model/cpu_runtime.h"
#include "model/masks.h"
#include "model/step_cost.h"

namespace praxis::model {

BackboneStepRunner::BackboneStepRunner(std::unique_ptr<VideoBackbone> model, RunnerOptions options)
    : model_(std::move(model)), intra_op_threads_(options.intra_op_threads) {
  const bool cuda = model_->options().device.is_cuda();
  if (cuda && options.cuda_graph_bytes > 0) {
    graphs_ = std::make_unique<StepGraphs>(*model_, options.cuda_graph_bytes);
  }
  if (!cuda && intra_op_threads_ >= 2 && options.thread_probe_every > absl::ZeroDuration()) {
    chooser_ =
        std::make_unique<IntraOpThreadChooser>(intra_op_threads_, options.thread_probe_every);
  }
}

namespace {

// Moves the wanted outputs of `out` (on a CUDA device) to the host: each into pinned memory with a
// copy queued on the current stream, then one synchronisation for them all. Throws (LibTorch).
void WantedToHost(BackboneOutput& out, const OutputSelection& wanted) {
  for (auto& [tensor, want] : OutputSlots(out, wanted)) {
    if (!want || !tensor->defined() || !tensor->is_cuda()) continue;  // positions: on the host
    torch::Tensor host =
        torch::empty(tensor->sizes(), tensor->options().device(torch::kCPU).pinned_memory(true));
    host.copy_(*tensor, /*non_blocking=*/true);
    *tensor = std::move(host);
  }
  c10::cuda::getCurrentCUDAStream().synchronize();
}

}  // namespace

absl::StatusOr<BackboneOutput> BackboneStepRunner::RunOnShare(const StepInputs& batch,
                                                              const OutputSelection& wanted,
                                                              int shares) {
  thread_local int applied = 0;
  // A batch beside others runs on one thread: a second team of intra-op threads would make
  // libgomp's teams sleep between ops (model/cpu_runtime.h). The chooser times only the batches
  // that run alone, whose rates compare.
  const bool alone = shares <= 1;
  int threads = alone || intra_op_threads_ == 0 ? intra_op_threads_ : 1;
  if (chooser_ != nullptr && alone) {
    absl::MutexLock lock(&chooser_mu_);
    threads = chooser_->Next();
  }
  if (threads > 0 && applied != threads) {
    SetIntraOpThreadsOfThisThread(threads);
    applied = threads;
  }
  const torch::Device dev = model_->options().device;
  const absl::Time start = absl::Now();
  absl::StatusOr<BackboneOutput> out =
      graphs_ != nullptr ? graphs_->Run(batch) : model_->ForwardValidated(batch);
  if (!out.ok()) return out;
  if (!dev.is_cuda() && threads > 0) last_threads_.store(threads, std::memory_order_relaxed);
  if (chooser_ != nullptr && alone) {
    const double gflop =
        ComputeStepCost(config(), StepLayout(batch), batch.decode, batch.noised.size(0)).gflop();
    absl::MutexLock lock(&chooser_mu_);
    chooser_->Record(gflop, absl::Now() - start);
  }
  KeepOnly(*out, wanted);  // before the copy: unwanted outputs never leave the device
  if (!dev.is_cuda()) return out;
  try {
    WantedToHost(*out, wanted);
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("copying outputs to the host: ") + e.what());
  }
  return out;
}

std::optional<GraphStats> BackboneStepRunner::graph_stats() const {
  if (graphs_ == nullptr) return std::nullopt;
  return graphs_->stats();
}

std::optional<IntraOpThreads> BackboneStepRunner::intra_op_threads() const {
  const int threads = last_threads_.load(std::memory_order_relaxed);
  if (threads == 0) return std::nullopt;
  IntraOpThreads answer{.threads = threads};
  if (chooser_ != nullptr) {
    absl::MutexLock lock(&chooser_mu_);
    answer.switches = chooser_->switches();
  }
  return answer;
}

std::string BackboneStepRunner::device() const { return model_->options().device.str(); }

std::string BackboneStepRunner::dtype() const { return DtypeName(model_->dtype()); }

std::optional<int64_t> BackboneStepRunner::device_memory_bytes() const {
  const torch::Device dev = model_->options().device;
  if (!dev.is_cuda()) return std::nullopt;
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index() < 0 ? 0 : dev.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

}  // namespace praxis::model
