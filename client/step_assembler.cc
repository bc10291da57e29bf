#include "client/step_assembler.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "wire/tensor_codec.h"

namespace praxis::client {
namespace {

// The wire codec's limit on dimensions; a header beyond it can only be hostile.
constexpr int kMaxDims = 8;

// OK iff `t` is a tensor this client can hold: a known dtype, at most kMaxDims non-negative
// dimensions whose byte size fits in int64 and equals the announced nbytes. Checked with the
// header, before any byte is kept, so that a hostile or broken server gets DataLoss, never a
// wrapped size that LibTorch would then refuse by throwing.
absl::Status CheckTensorHeader(const v1::TensorHeader& t) {
  absl::StatusOr<torch::ScalarType> dtype = wire::FromWireDtype(t.dtype(), t.name());
  if (!dtype.ok()) return absl::DataLossError(dtype.status().message());
  const std::string shape = absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
  if (t.shape_size() > kMaxDims) {
    return absl::DataLossError(
        absl::StrCat(t.name(), ": shape ", shape, " has more than ", kMaxDims, " dimensions"));
  }
  std::optional<int64_t> numel = CheckedProduct(absl::MakeConstSpan(t.shape()));
  std::optional<int64_t> nbytes;
  if (numel) nbytes = CheckedMul(*numel, static_cast<int64_t>(c10::elementSize(*dtype)));
  if (!nbytes) {
    return absl::DataLossError(
        absl::StrCat(t.name(), ": shape ", shape, " is negative or too large to hold"));
  }
  if (*nbytes != t.nbytes()) {
    return absl::DataLossError(absl::StrCat(t.name(), ": header announces ", t.nbytes(),
                                            " bytes for shape ", shape, ", which holds ", *nbytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> StepAssembler::Add(const v1::StepResponse& msg) {
  if (complete_) return absl::DataLossError("message after the trailer");
  switch (msg.kind_case()) {
    case v1::StepResponse::kError:
      // An error that says OK is no answer at all (and an OK status cannot be a StatusOr's error).
      if (msg.error().code() == 0) return absl::DataLossError("a StepError with code OK");
      return absl::Status(static_cast<absl::StatusCode>(msg.error().code()), msg.error().message());
    case v1::StepResponse::kHeader:
      PRAXIS_RETURN_IF_ERROR(AddHeader(msg.header()));
      return false;
    case v1::StepResponse::kChunk:
      if (!have_header_) return absl::DataLossError("a chunk before the header");
      return AddChunk(msg.chunk());
    case v1::StepResponse::kTrailer:
      if (!have_header_) return absl::DataLossError("a trailer before the header");
      return AddTrailer(msg.trailer());
    case v1::StepResponse::kAnswer: {
      // The stream's messages in one: held to the same order and sizes.
      const v1::StepAnswer& a = msg.answer();
      if (!a.has_header()) return absl::DataLossError("an answer without its header");
      if (!a.has_trailer()) return absl::DataLossError("an answer without its trailer");
      PRAXIS_RETURN_IF_ERROR(AddHeader(a.header()));
      for (const v1::TensorChunk& c : a.chunks()) PRAXIS_RETURN_IF_ERROR(AddChunk(c).status());
      return AddTrailer(a.trailer());
    }
    case v1::StepResponse::KIND_NOT_SET:
      break;
  }
  return absl::DataLossError("an empty StepResponse");
}

absl::Status StepAssembler::AddHeader(const v1::StepHeader& h) {
  if (have_header_) return absl::DataLossError("a second header");
  for (const v1::TensorHeader& t : h.tensors()) PRAXIS_RETURN_IF_ERROR(CheckTensorHeader(t));
  have_header_ = true;
  reply_.header = h;
  bytes_.clear();
  current_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> StepAssembler::AddTrailer(const v1::StepTrailer& t) {
  PRAXIS_RETURN_IF_ERROR(SkipEmpty());
  if (current_ < reply_.header.tensors_size()) {
    const v1::TensorHeader& h = reply_.header.tensors(current_);
    return absl::DataLossError(absl::StrCat(h.name(), ": got ", bytes_.size(), " of ", h.nbytes(),
                                            " bytes before the trailer"));
  }
  reply_.trailer = t;
  complete_ = true;
  return true;
}

absl::Status StepAssembler::Finish() {
  const v1::TensorHeader& t = reply_.header.tensors(current_);
  v1::Tensor encoded;
  encoded.set_dtype(t.dtype());
  *encoded.mutable_shape() = t.shape();
  encoded.set_data(std::move(bytes_));
  bytes_.clear();
  absl::StatusOr<torch::Tensor> tensor = wire::DecodeTensor(encoded, t.name());
  if (!tensor.ok()) return absl::DataLossError(tensor.status().message());
  reply_.tensors[t.name()] = *std::move(tensor);
  ++current_;
  return absl::OkStatus();
}

absl::Status StepAssembler::SkipEmpty() {
  while (current_ < reply_.header.tensors_size() && bytes_.empty() &&
         reply_.header.tensors(current_).nbytes() == 0) {
    PRAXIS_RETURN_IF_ERROR(Finish());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> StepAssembler::AddChunk(const v1::TensorChunk& c) {
  PRAXIS_RETURN_IF_ERROR(SkipEmpty());
  if (current_ >= reply_.header.tensors_size()) {
    return absl::DataLossError(absl::StrCat(c.name(), ": a chunk after every tensor was complete"));
  }
  const v1::TensorHeader& t = reply_.header.tensors(current_);
  if (c.name() != t.name()) {
    return absl::DataLossError(
        absl::StrCat("chunk of ", c.name(), " while ", t.name(), " was incomplete"));
  }
  if (c.offset() != static_cast<int64_t>(bytes_.size())) {
    return absl::DataLossError(
        absl::StrCat(t.name(), ": chunk at offset ", c.offset(), ", expected ", bytes_.size()));
  }
  if (static_cast<int64_t>(bytes_.size() + c.data().size()) > t.nbytes()) {
    return absl::DataLossError(
        absl::StrCat(t.name(), ": chunks exceed the announced ", t.nbytes(), " bytes"));
  }
  bytes_.append(c.data());
  if (static_cast<int64_t>(bytes_.size()) == t.nbytes()) PRAXIS_RETURN_IF_ERROR(Finish());
  return false;
}

StepReply StepAssembler::Take() {
  StepReply r = std::move(reply_);
  *this = StepAssembler();
  return r;
}

}  // namespace praxis::client
