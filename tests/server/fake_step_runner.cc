#include "tests/server/fake_step_runner.h"

#include <torch/torch.h>

#include <stdexcept>
#include <utility>

#include "common/status_macros.h"
#include "model/config.h"
#include "model/model_loader.h"
#include "wire/layout_key.h"

namespace praxis::serve::fixtures {
namespace {

model::BackboneConfig ConfigOf(const FakeStepRunnerOptions& o) {
  if (o.config) return *o.config;
  return model::ParseConfig(model::kEmbeddedTinyConfig).value();
}

// The encoder sequence of the real model: registers, anchor, text, noised, then clean (K > 1).
void SetSpans(const model::BackboneConfig& c, const model::StepInputs& in,
              model::EncoderFeatures& ft) {
  const int64_t kf = in.noised.size(2), h = in.noised.size(3), w = in.noised.size(4);
  const int64_t f = in.frames_per_chunk, k = kf / f;
  const int64_t r = c.num_registers, la = in.anchor.size(3) * in.anchor.size(4);
  const int64_t lt = in.text.size(1);
  ft.register_span = {0, r};
  ft.anchor_span = {r, la};
  ft.text_span = {r + la, lt};
  ft.noised_span = {r + la + lt, kf * h * w};
  if (k > 1) ft.clean_span = model::Span{r + la + lt + kf * h * w, (k - 1) * f * h * w};
  ft.frames_per_chunk = f;
  ft.tokens_per_frame = h * w;
  ft.n_chunks = k;
}

// Tokens of the encoder sequence whose spans `ft` holds.
int64_t Tokens(const model::EncoderFeatures& ft) {
  const model::Span last = ft.clean_span ? *ft.clean_span : ft.noised_span;
  return last.start + last.length;
}

}  // namespace

FakeStepRunner::FakeStepRunner(FakeStepRunnerOptions options)
    : config_(ConfigOf(options)),
      device_(options.device),
      dtype_name_(options.dtype),
      dtype_(model::ParseDtype(options.dtype).value()) {}

model::BackboneOutput FakeStepRunner::Outputs(const model::BackboneConfig& config,
                                              const model::StepInputs& batch,
                                              torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  model::BackboneOutput out;
  model::EncoderFeatures& ft = out.features;
  SetSpans(config, batch, ft);
  const torch::Tensor noised = batch.noised.to(torch::kFloat32);
  const int64_t b = noised.size(0), kf = noised.size(2), h = noised.size(3), w = noised.size(4);
  const int64_t t = Tokens(ft);
  if (batch.decode) {
    const torch::Tensor per_frame = batch.timesteps.to(torch::kFloat32)
                                        .repeat_interleave(batch.frames_per_chunk, 1)
                                        .view({b, 1, kf, 1, 1});
    out.velocity = (noised * 2 + per_frame).to(dtype);
  }
  out.cond = noised.mean(1).unsqueeze(-1).expand({b, kf, h, w, config.dim}).to(dtype).contiguous();
  const torch::Tensor row = batch.text.to(torch::kFloat32).mean({1, 2}).view({b, 1, 1});
  const torch::Tensor index = torch::arange(t, torch::kFloat32).view({1, t, 1});
  const torch::Tensor embeddings = (row + index).expand({b, t, config.dim});
  ft.embeddings = embeddings.to(dtype).contiguous();
  for (size_t i = 0; i < config.encoder.tap_blocks.size(); ++i) {
    ft.taps.push_back((embeddings + static_cast<double>(i + 1)).to(dtype).contiguous());
  }
  ft.positions = torch::arange(t, torch::kInt64).unsqueeze(0).expand({b, t}).contiguous();
  return out;
}

void FakeStepRunner::Close() {
  absl::MutexLock l(&mu_);
  open_ = false;
}

void FakeStepRunner::Open() {
  absl::MutexLock l(&mu_);
  open_ = true;
}

void FakeStepRunner::ThrowNext() {
  absl::MutexLock l(&mu_);
  throw_next_ = true;
}

void FakeStepRunner::FailNext(absl::Status status) {
  absl::MutexLock l(&mu_);
  fail_next_ = std::move(status);
}

void FakeStepRunner::SetDelay(absl::Duration delay) {
  absl::MutexLock l(&mu_);
  delay_ = delay;
}

bool FakeStepRunner::WaitEntered(int64_t n, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  const auto reached = [this, n]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return entered_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

int64_t FakeStepRunner::batches_entered() const {
  absl::MutexLock l(&mu_);
  return entered_;
}

int64_t FakeStepRunner::rows_run() const {
  absl::MutexLock l(&mu_);
  return rows_;
}

model::MaskCacheStats FakeStepRunner::mask_cache_stats() const {
  absl::MutexLock l(&mu_);
  return mask_stats_;
}

std::vector<model::OutputSelection> FakeStepRunner::wanted() const {
  absl::MutexLock l(&mu_);
  return wanted_;
}

absl::StatusOr<model::BackboneOutput> FakeStepRunner::RunOnShare(
    const model::StepInputs& batch, const model::OutputSelection& wanted, int shares) {
  PRAXIS_RETURN_IF_ERROR(model::ValidateStep(config_, batch));
  absl::Duration delay;
  absl::Status fail;
  {
    absl::MutexLock l(&mu_);
    ++entered_;
    // Bounded, so that a broken test cannot hang the suite.
    mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Seconds(120));
    rows_ += batch.noised.size(0);
    wanted_.push_back(wanted);
    if (std::exchange(throw_next_, false)) throw std::runtime_error("injected failure");
    fail = std::exchange(fail_next_, absl::OkStatus());
    delay = delay_;
    if (layouts_.insert(wire::LayoutKey(batch)).second) {
      ++mask_stats_.misses;
      mask_stats_.entries = static_cast<int64_t>(layouts_.size());
      model::EncoderFeatures ft;
      SetSpans(config_, batch, ft);
      mask_stats_.bytes += Tokens(ft) * Tokens(ft);  // as a dense bool [T, T] mask would hold
    } else {
      ++mask_stats_.hits;
    }
  }
  absl::SleepFor(delay);
  PRAXIS_RETURN_IF_ERROR(fail);
  model::BackboneOutput out = Outputs(config_, batch, dtype_);
  model::KeepOnly(out, wanted);
  return out;
}

}  // namespace praxis::serve::fixtures
