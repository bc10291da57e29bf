#pragma once

// The header of a safetensors file, parsed and validated as untrusted input: an 8-byte
// little-endian length, then that many bytes of JSON naming each tensor's dtype, shape and byte
// range in the data region that follows.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace praxis::wire {

// The longest JSON header accepted. A real one is under 1 MiB even for thousands of tensors; the
// parsed JSON takes up to ~10x its text, so the safetensors reference's 100 MB would let one file
// cost a gigabyte before a tensor is read.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{32} << 20;

// Where one tensor lies in a safetensors file, as its header says.
struct TensorInfo {
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data region (after the header), [begin, end)
  uint64_t end = 0;
};

// A validated header: its tensors tile the data region exactly, in byte order, with no overlap,
// gap or trailing byte, and each range holds exactly dtype size x numel bytes.
struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + header length: the data region's offset in the file
  std::map<std::string, TensorInfo> entries;
  std::map<std::string, std::string> metadata;  // `__metadata__`, string to string
};

// The header length in the first 8 bytes of a `file_bytes`-byte file. InvalidArgument for a file
// shorter than 8 bytes, or a length beyond the file or kMaxSafetensorsHeaderBytes.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view first_8_bytes,
                                                      uint64_t file_bytes);

// Parses `json` (the header, after the length) of a `file_bytes`-byte file. InvalidArgument (naming
// the tensor where there is one) for JSON that is not an object, an entry without dtype, shape or
// data_offsets, an unknown dtype, a size that overflows, a byte range reversed, beyond the data
// region (a truncated file) or not matching dtype x shape, tensors that overlap or leave a gap,
// or bytes after the last tensor. Pure and thread-safe.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(absl::string_view json,
                                                             uint64_t file_bytes);

// Both of the above, over the whole bytes of a safetensors file: the entry point of the header
// fuzzer and of tests that need no file. Pure and thread-safe.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file);

// The torch dtype of a safetensors dtype code ("F32", "BF16", ...); InvalidArgument if unknown.
absl::StatusOr<torch::ScalarType> SafetensorsDtype(absl::string_view name);

// The safetensors dtype code ("F32", "BF16", ...) of a torch dtype; InvalidArgument if none.
absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype);

}  // namespace praxis::wire
