#include "server/step_response.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/tensor_codec.h"

namespace praxis::serve {
namespace {

void SetSpan(const model::Span& s, v1::Span* out) {
  out->set_start(s.start);
  out->set_length(s.length);
}

}  // namespace

absl::StatusOr<StepResponder> StepResponder::Create(const StepResult& r, const OutputPlan& plan,
                                                    const std::string& request_id,
                                                    absl::Time accepted, int64_t max_chunk_bytes) {
  if (max_chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_chunk_bytes: expected >= 1, got ", max_chunk_bytes));
  }
  const model::BackboneOutput& o = r.output;
  const model::EncoderFeatures& f = o.features;
  std::vector<std::pair<std::string, const torch::Tensor*>> wanted;
  if (plan.velocity) wanted.emplace_back("velocity", &o.velocity);
  if (plan.cond) wanted.emplace_back("cond", &o.cond);
  for (int t : plan.taps) wanted.emplace_back(absl::StrCat("tap.", t), &f.taps.at(t));
  if (plan.embeddings) wanted.emplace_back("embeddings", &f.embeddings);
  if (plan.positions) wanted.emplace_back("positions", &f.positions);

  StepResponder s;
  s.max_chunk_bytes_ = max_chunk_bytes;
  s.accepted_ = accepted;
  s.queue_time_ = r.queue_time;
  s.compute_time_ = r.compute_time;
  v1::StepHeader& h = s.header_;
  h.set_layout_key(r.layout_key);
  h.set_request_id(request_id);
  for (const auto& [name, tensor] : wanted) {
    const v1::DType wire = tensor->scalar_type() == torch::kInt64 ? v1::INT64 : plan.wire_dtype;
    PRAXIS_ASSIGN_OR_RETURN(std::string bytes, TensorBytes(*tensor, wire));
    v1::TensorHeader* th = h.add_tensors();
    th->set_name(name);
    th->set_dtype(wire);
    for (int64_t d : tensor->sizes()) th->add_shape(d);
    th->set_nbytes(static_cast<int64_t>(bytes.size()));
    s.outputs_.push_back({name, std::move(bytes)});
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
  return s;
}

bool StepResponder::Next(v1::StepResponse* msg) {
  msg->Clear();
  switch (stage_) {
    case Stage::kHeader:
      *msg->mutable_header() = header_;
      stage_ = Stage::kChunks;
      return true;
    case Stage::kChunks:
      while (output_ < outputs_.size() &&
             offset_ >= static_cast<int64_t>(outputs_[output_].bytes.size())) {
        outputs_[output_].bytes = std::string();  // sent: free it
        ++output_;
        offset_ = 0;
      }
      if (output_ < outputs_.size()) {
        const Output& out = outputs_[output_];
        const int64_t n =
            std::min<int64_t>(max_chunk_bytes_, static_cast<int64_t>(out.bytes.size()) - offset_);
        v1::TensorChunk* c = msg->mutable_chunk();
        c->set_name(out.name);
        c->set_offset(offset_);
        c->set_data(out.bytes.data() + offset_, n);
        offset_ += n;
        return true;
      }
      stage_ = Stage::kTrailer;
      [[fallthrough]];
    case Stage::kTrailer: {
      v1::StepTrailer* t = msg->mutable_trailer();
      t->set_queue_us(absl::ToInt64Microseconds(queue_time_));
      t->set_compute_us(absl::ToInt64Microseconds(compute_time_));
      t->set_total_us(absl::ToInt64Microseconds(absl::Now() - accepted_));
      stage_ = Stage::kDone;
      return true;
    }
    case Stage::kDone:
      return false;
  }
  return false;
}

}  // namespace praxis::serve
