#include "wire/tensor_codec.h"

#include <bit>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace praxis::wire {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; a big-endian host would need byte swapping");

constexpr int kMaxDims = 8;

}  // namespace

absl::StatusOr<torch::ScalarType> FromWireDtype(int wire, absl::string_view field) {
  switch (wire) {
    case v1::FLOAT32:
      return torch::kFloat32;
    case v1::BFLOAT16:
      return torch::kBFloat16;
    case v1::FLOAT16:
      return torch::kFloat16;
    case v1::INT64:
      return torch::kInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".dtype: expected FLOAT32, BFLOAT16, FLOAT16 or INT64, got ", wire));
  }
}

absl::StatusOr<v1::DType> ToWireDtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return v1::FLOAT32;
    case torch::kBFloat16:
      return v1::BFLOAT16;
    case torch::kFloat16:
      return v1::FLOAT16;
    case torch::kInt64:
      return v1::INT64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(dtype), " has no wire form"));
  }
}

absl::StatusOr<torch::Tensor> DecodeTensor(const v1::Tensor& t, absl::string_view field) {
  PRAXIS_ASSIGN_OR_RETURN(torch::ScalarType dtype, FromWireDtype(t.dtype(), field));
  if (t.shape_size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: expected at most ", kMaxDims,
                                                   " dimensions, got ", t.shape_size()));
  }
  const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  // Checked: the expected byte count of [2^62] float32 must not wrap to 0, and a zero dimension
  // must not hide an overflowing product of the others ([0, 2^40, 2^40]).
  const std::optional<int64_t> numel = CheckedProduct(shape, INT64_MAX / element);
  if (!numel) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: expected non-negative sizes whose ", c10::toString(dtype),
                     " bytes fit in 64 bits, got [", absl::StrJoin(shape, ", "), "]"));
  }
  const int64_t want = *numel * element;
  if (static_cast<int64_t>(t.data().size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: expected ", want, " bytes for shape [", absl::StrJoin(shape, ", "), "] of ",
        c10::toString(dtype), ", got ", t.data().size()));
  }
  try {
    torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(dtype));
    if (want > 0) std::memcpy(out.data_ptr(), t.data().data(), want);
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot hold the tensor: ", e.what()));
  }
}

absl::StatusOr<torch::ScalarType> WireTarget(const torch::Tensor& t, v1::DType wire) {
  if (!t.is_floating_point()) {
    PRAXIS_RETURN_IF_ERROR(ToWireDtype(t.scalar_type()).status());
    return t.scalar_type();
  }
  PRAXIS_ASSIGN_OR_RETURN(torch::ScalarType target, FromWireDtype(wire, "wire_dtype"));
  if (target == torch::kInt64) {
    return absl::InvalidArgumentError("wire_dtype: expected a float dtype, got INT64");
  }
  return target;
}

absl::StatusOr<std::string> TensorBytes(const torch::Tensor& t, v1::DType wire) {
  PRAXIS_ASSIGN_OR_RETURN(torch::ScalarType target, WireTarget(t, wire));
  const torch::Tensor c = t.to(torch::kCPU, target).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

absl::StatusOr<v1::Tensor> EncodeTensor(const torch::Tensor& t, v1::DType wire) {
  PRAXIS_ASSIGN_OR_RETURN(torch::ScalarType target, WireTarget(t, wire));
  PRAXIS_ASSIGN_OR_RETURN(std::string bytes, TensorBytes(t, wire));
  v1::Tensor out;
  out.set_dtype(*ToWireDtype(target));
  for (int64_t d : t.sizes()) out.add_shape(d);
  out.set_data(std::move(bytes));
  return out;
}

}  // namespace praxis::wire
