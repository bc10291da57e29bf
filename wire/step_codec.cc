#include "wire/step_codec.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "wire/tensor_codec.h"

namespace praxis::wire {
namespace {

// The StepRequest field that carries `input`; every kInputFields name is one (a broken
// invariant, not a user error, if not).
const google::protobuf::FieldDescriptor* RequestField(const InputField& input) {
  const google::protobuf::FieldDescriptor* f =
      v1::StepRequest::descriptor()->FindFieldByName(input.name);
  PRAXIS_CHECK(f != nullptr && f->message_type() == v1::Tensor::descriptor(), input.name);
  return f;
}

}  // namespace

absl::Status DecodeInputTensors(const v1::StepRequest& r, StepInputs* in) {
  const google::protobuf::Reflection* refl = r.GetReflection();
  for (const InputField& input : kInputFields) {
    if (!input.optional && !(in->*input.tensor).defined() &&
        !refl->HasField(r, RequestField(input))) {
      return absl::InvalidArgumentError(absl::StrCat(input.name, ": expected a tensor, got none"));
    }
  }
  for (const InputField& input : kInputFields) {
    const google::protobuf::FieldDescriptor* f = RequestField(input);
    if (!refl->HasField(r, f)) continue;
    const auto& t = static_cast<const v1::Tensor&>(refl->GetMessage(r, f));
    PRAXIS_ASSIGN_OR_RETURN(in->*input.tensor, DecodeTensor(t, input.name));
  }
  return absl::OkStatus();
}

absl::Status EncodeInputTensors(const StepInputs& in, v1::DType dtype, v1::StepRequest* r) {
  const google::protobuf::Reflection* refl = r->GetReflection();
  for (const InputField& input : kInputFields) {
    const torch::Tensor& t = in.*input.tensor;
    if (!t.defined()) continue;
    PRAXIS_ASSIGN_OR_RETURN(v1::Tensor wire, EncodeTensor(t, dtype));
    static_cast<v1::Tensor*>(refl->MutableMessage(r, RequestField(input)))->Swap(&wire);
  }
  return absl::OkStatus();
}

}  // namespace praxis::wire
