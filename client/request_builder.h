#pragma once

// Building a praxis.v1.StepRequest from LibTorch tensors, for the CLI, the load generator and
// embedders. The contract itself (tensor codec, names, layout key) is wire/'s.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "praxis/v1/praxis.pb.h"
#include "wire/output_names.h"
#include "wire/step_inputs.h"

namespace praxis::client {

// What a request asks for and how its tensors travel.
struct RequestOptions {
  // velocity, cond, taps (all), tap.N, embeddings, positions.
  std::vector<std::string> outputs = {wire::kVelocity};
  v1::DType wire_dtype = v1::FLOAT32;   // of the float outputs
  v1::DType input_dtype = v1::FLOAT32;  // of the float inputs on the wire
  std::string request_id;
  // The answer in one message where it fits the server's chunk size (StepRequest.whole_answer).
  bool whole_answer = true;
};

// The request for `in` (any device; copied to the wire in options.input_dtype).
absl::StatusOr<v1::StepRequest> MakeStepRequest(const wire::StepInputs& in,
                                                const RequestOptions& options);

// The input feature sizes a served model wants, from its GetModelInfo answer.
wire::StepDims StepDimsOf(const v1::ModelInfo& info);

// The server's layout key (wire::LayoutKey) of `request`, from its shapes alone; empty when the
// shapes are malformed (the server then refuses the request and names the field).
std::string LayoutKeyOf(const v1::StepRequest& request);

}  // namespace praxis::client
