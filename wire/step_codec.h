#pragma once

// A step's input tensors between a praxis.v1.StepRequest and StepInputs, field by field through
// kInputFields (whose names are the StepRequest's tensor fields), so that neither the server's
// decoder nor the clients' request builder lists the five inputs again.

#include "absl/status/status.h"
#include "praxis/v1/praxis.pb.h"
#include "wire/step_inputs.h"

namespace praxis::wire {

// Decodes the tensors of `r` into `in` (other fields untouched). InvalidArgument naming the field
// for a required tensor that is missing (checked for all before any is decoded) or one that
// DecodeTensor refuses; an absent tensor is left as `in` holds it (undefined, or one the caller
// supplies: a Session's kept text).
absl::Status DecodeInputTensors(const v1::StepRequest& r, StepInputs* in);

// Encodes each defined tensor of `in` into `r`, float tensors as `dtype` (any device).
absl::Status EncodeInputTensors(const StepInputs& in, v1::DType dtype, v1::StepRequest* r);

}  // namespace praxis::wire
