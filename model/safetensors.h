#pragma once

// Memory-mapped safetensors files: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace praxis::model {

// Where one tensor lies in a safetensors file, as its header says.
struct TensorInfo {
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data region (after the header), [begin, end)
  uint64_t end = 0;
};

// One opened safetensors file. The file is mapped read-only (PROT_READ) once; Get returns
// zero-copy CPU views whose storage holds a reference to the mapping, so tensors may outlive this
// object. The views are read-only memory: write into a clone, never in place. A tensor whose bytes
// are not aligned to its element size (a foreign writer's odd header length) is copied instead.
// Thread-safe after Open (all methods are const).
class SafetensorsFile {
 public:
  // Maps `path` and validates its header. NotFound when the file cannot be opened; InvalidArgument
  // naming the file (and tensor) for a header length beyond the file, a header that is not JSON, an
  // entry without dtype/shape/data_offsets, an unknown dtype, or a byte range that does not match
  // the shape or exceeds the data region (a truncated file).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  // The header entry of `name`, or nullptr.
  const TensorInfo* info(const std::string& name) const;
  // A view of tensor `name`; NotFound naming the file and tensor if absent.
  absl::StatusOr<torch::Tensor> Get(const std::string& name) const;
  // The header's `__metadata__` (string to string), empty if absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The mapped bytes (the whole file), to tell whether a tensor is a view of this file.
  std::pair<const uint8_t*, size_t> mapping() const;
  // True when `t`'s bytes lie inside this file's mapping (a zero-copy view).
  bool IsViewOf(const torch::Tensor& t) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, TensorInfo> entries_;
  std::map<std::string, std::string> metadata_;
};

// The safetensors dtype code ("F32", "BF16", ...) of a torch dtype; InvalidArgument if none.
absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype);

// Writes `tensors` (any device and layout; written as contiguous CPU bytes) to `path`
// deterministically: `__metadata__` first, then tensors by name, compact ASCII JSON padded with
// spaces to 8 bytes (the layout of tests/reference/make_tiny.py). InvalidArgument for a duplicate
// name or an unsupported dtype; Internal when the file cannot be written.
absl::Status WriteSafetensors(const std::string& path,
                              std::vector<std::pair<std::string, torch::Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace praxis::model
