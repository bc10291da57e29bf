#pragma once

// Building a praxis.v1.StepRequest from LibTorch tensors, for the CLI, the load generator and
// embedders.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/backbone.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::client {

// What a request asks for and how its tensors travel.
struct RequestOptions {
  // velocity, cond, taps (all), tap.N, embeddings, positions.
  std::vector<std::string> outputs = {"velocity"};
  v1::DType wire_dtype = v1::FLOAT32;   // of the float outputs
  v1::DType input_dtype = v1::FLOAT32;  // of the float inputs on the wire
  std::string request_id;
};

// "float32" | "bfloat16" | "float16"; InvalidArgument otherwise.
absl::StatusOr<v1::DType> ParseWireDtype(const std::string& name);

// The OutputSelection of `names`; InvalidArgument naming an unknown output.
absl::StatusOr<v1::OutputSelection> ParseOutputs(const std::vector<std::string>& names);

// The request for `in` (any device; copied to the wire in options.input_dtype).
absl::StatusOr<v1::StepRequest> MakeStepRequest(const model::StepInputs& in,
                                                const RequestOptions& options);

// The header a proxy hashes on to send one layout's steps to one replica (deploy/affinity).
inline constexpr char kLayoutHeader[] = "x-praxis-layout";

// The server's layout key (model::LayoutKey) of `request`, from its shapes alone; empty when the
// shapes are malformed (the server then refuses the request and names the field).
std::string LayoutKeyOf(const v1::StepRequest& request);

}  // namespace praxis::client
