#include "server/step_response.h"

#include <ATen/TensorIterator.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/output_names.h"
#include "wire/tensor_codec.h"

namespace praxis::serve {
namespace {

void SetSpan(const model::Span& s, v1::Span* out) {
  out->set_start(s.start);
  out->set_length(s.length);
}

}  // namespace

absl::StatusOr<StepResponder> StepResponder::Create(const StepResult& r, const OutputPlan& plan,
                                                    const std::string& request_id,
                                                    absl::Time accepted, int64_t max_chunk_bytes,
                                                    bool text_kept) {
  if (max_chunk_bytes < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_chunk_bytes: expected >= 8, got ", max_chunk_bytes));
  }
  try {
    StepResponder s;
    s.max_chunk_bytes_ = max_chunk_bytes;
    s.accepted_ = accepted;
    s.queue_time_ = r.queue_time;
    s.compute_time_ = r.compute_time;
    s.SetHeader(r, plan, request_id);
    s.header_.set_text_kept(text_kept);
    // Bounded as a chunk's message is: every tensor of it fits in one chunk.
    s.whole_ = plan.whole_answer && s.tensor_bytes_ <= max_chunk_bytes;
    return s;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("encoding the answer: ", e.what()));
  }
}

void StepResponder::SetHeader(const StepResult& r, const OutputPlan& plan,
                              const std::string& request_id) {
  const model::BackboneOutput& o = r.output;
  const model::EncoderFeatures& f = o.features;
  std::vector<std::pair<std::string, const torch::Tensor*>> wanted;
  if (plan.velocity) wanted.emplace_back(wire::kVelocity, &o.velocity);
  if (plan.cond) wanted.emplace_back(wire::kCond, &o.cond);
  for (int t : plan.taps) wanted.emplace_back(wire::TapName(t), &f.taps.at(t));
  if (plan.embeddings) wanted.emplace_back(wire::kEmbeddings, &f.embeddings);
  if (plan.positions) wanted.emplace_back(wire::kPositions, &f.positions);
  v1::StepHeader& h = header_;
  h.set_layout_key(r.layout_key);
  h.set_request_id(request_id);
  for (const auto& [name, tensor] : wanted) {
    // May throw; Create turns it into an error.
    const torch::ScalarType target = wire::WireTarget(*tensor, plan.wire_dtype).value();
    const v1::DType wire_dtype = wire::ToWireDtype(target).value();
    // No copy for a host tensor that is already contiguous, as a row slice of a batch is: kept as
    // a view, it holds the batch's tensor until sent. The batch runner made it a view only where
    // every caller of the batch asked for this output (server/step_batch.h TaskRows), so the
    // tensors held are rows whose answers the pending-answer budget counts (in the wire dtype:
    // an fp32 model holds up to twice what a 16-bit wire answer reserved, as a copy would).
    torch::Tensor flat = tensor->to(torch::kCPU).contiguous().view({-1});
    Output out{name, std::move(flat), target};
    const int64_t nbytes = out.flat.numel() * static_cast<int64_t>(c10::elementSize(out.wire));
    v1::TensorHeader* th = h.add_tensors();
    th->set_name(name);
    th->set_dtype(wire_dtype);
    for (int64_t d : tensor->sizes()) th->add_shape(d);
    th->set_nbytes(nbytes);
    tensor_bytes_ += nbytes;
    outputs_.push_back(std::move(out));
  }
  SetSpan(f.register_span, h.mutable_register_span());
  SetSpan(f.anchor_span, h.mutable_anchor_span());
  SetSpan(f.text_span, h.mutable_text_span());
  SetSpan(f.noised_span, h.mutable_noised_span());
  if (f.clean_span) SetSpan(*f.clean_span, h.mutable_clean_span());
  h.set_frames_per_chunk(f.frames_per_chunk);
  h.set_tokens_per_frame(f.tokens_per_frame);
  h.set_n_chunks(f.n_chunks);
  h.set_queue_us(absl::ToInt64Microseconds(r.queue_time));
  h.set_compute_us(absl::ToInt64Microseconds(r.compute_time));
  h.set_batch_rows(static_cast<int32_t>(r.batch_rows));
}

void StepResponder::NextChunk(v1::TensorChunk* c) {
  Output& out = outputs_[output_];
  const int64_t size = static_cast<int64_t>(c10::elementSize(out.wire));
  const int64_t n = std::min(max_chunk_bytes_ / size, out.flat.numel() - element_);
  c->set_name(out.name);
  c->set_offset(element_ * size);
  // One pass over the bytes sent: straight from the tensor's memory into the message's string,
  // converted on the way where the wire dtype differs (ATen's vectorised copy).
  std::string& data = *c->mutable_data();
  data.resize(static_cast<size_t>(n * size));
  if (out.flat.scalar_type() == out.wire) {
    std::memcpy(data.data(), static_cast<const char*>(out.flat.data_ptr()) + element_ * size,
                static_cast<size_t>(n * size));
  } else {
    // In pieces ATen converts on the calling thread (at most GRAIN_SIZE elements): a larger copy
    // starts an OpenMP team on this gRPC thread beside the model's, which on 2 busy cores made
    // the bf16 conversion 25x slower (docs/benchmarks.md, issue 13).
    const torch::Tensor to = torch::from_blob(data.data(), {n}, torch::dtype(out.wire));
    for (int64_t done = 0; done < n; done += at::internal::GRAIN_SIZE) {
      const int64_t m = std::min(at::internal::GRAIN_SIZE, n - done);
      to.narrow(0, done, m).copy_(out.flat.narrow(0, element_ + done, m));
    }
  }
  element_ += n;
}

bool StepResponder::NextOutput() {
  while (output_ < outputs_.size() && element_ >= outputs_[output_].flat.numel()) {
    outputs_[output_].flat = torch::Tensor();  // sent: free it
    ++output_;
    element_ = 0;
  }
  return output_ < outputs_.size();
}

void StepResponder::FillTrailer(v1::StepTrailer* t) {
  t->set_queue_us(absl::ToInt64Microseconds(queue_time_));
  t->set_compute_us(absl::ToInt64Microseconds(compute_time_));
  t->set_total_us(absl::ToInt64Microseconds(absl::Now() - accepted_));
  stage_ = Stage::kDone;
}

void StepResponder::FillWhole(v1::StepAnswer* answer) {
  *answer->mutable_header() = header_;
  while (NextOutput()) NextChunk(answer->add_chunks());
  FillTrailer(answer->mutable_trailer());
}

absl::StatusOr<bool> StepResponder::Next(v1::StepResponse* msg) {
  msg->Clear();
  switch (stage_) {
    case Stage::kHeader:
      if (whole_) {
        try {
          FillWhole(msg->mutable_answer());
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("encoding the answer: ", e.what()));
        }
        return true;
      }
      *msg->mutable_header() = header_;
      stage_ = Stage::kChunks;
      return true;
    case Stage::kChunks:
      if (NextOutput()) {
        try {
          NextChunk(msg->mutable_chunk());
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("encoding a chunk: ", e.what()));
        }
        return true;
      }
      stage_ = Stage::kTrailer;
      [[fallthrough]];
    case Stage::kTrailer:
      FillTrailer(msg->mutable_trailer());
      return true;
    case Stage::kDone:
      return false;
  }
  return false;
}

}  // namespace praxis::serve
