#pragma once

// Tensors between the wire (praxis.v1.Tensor: dtype, shape, little-endian row-major bytes) and
// LibTorch.

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::wire {

// The torch dtype of a wire dtype; InvalidArgument naming `field` for DTYPE_UNSPECIFIED or an
// unknown value.
absl::StatusOr<torch::ScalarType> FromWireDtype(int wire, absl::string_view field);

// The wire dtype of a torch dtype; InvalidArgument for dtypes the API does not carry.
absl::StatusOr<v1::DType> ToWireDtype(torch::ScalarType dtype);

// A CPU tensor owning a copy of `t`'s bytes. InvalidArgument naming `field` for a bad dtype, a
// negative dimension, more than 8 dimensions or a byte length that does not match the shape.
absl::StatusOr<torch::Tensor> DecodeTensor(const v1::Tensor& t, absl::string_view field);

// The wire form of `t` (any device) converted to `wire` (float outputs) or kept (int64).
absl::StatusOr<v1::Tensor> EncodeTensor(const torch::Tensor& t, v1::DType wire);

// The dtype `t` travels as: `wire` for float tensors, its own for int64. InvalidArgument for a
// dtype the API does not carry, or an INT64 wire for a float tensor.
absl::StatusOr<torch::ScalarType> WireTarget(const torch::Tensor& t, v1::DType wire);

// Row-major little-endian bytes of `t` converted to `wire`, all at once.
absl::StatusOr<std::string> TensorBytes(const torch::Tensor& t, v1::DType wire);

}  // namespace praxis::wire
