#pragma once

// Safetensors files: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data. The header is validated as
// untrusted input (wire/safetensors_header.h); tensors are read into memory or memory-mapped.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "wire/safetensors_header.h"

namespace praxis::wire {

// How a SafetensorsFile hands out tensor bytes (the server's --load flag).
enum class LoadMode {
  // Get reads each tensor into memory of its own. The file may change, shrink or vanish afterwards
  // without harm to tensors already read: the default, and the only safe mode for a checkpoint
  // directory that anything else can write to.
  kCopy,
  // The file is mapped read-only and Get returns zero-copy views: no second copy of the weights and
  // a faster start. RISK: if the file is truncated (or its storage goes away) while views are
  // alive, the next touch of a lost page raises SIGBUS and kills the whole process.
  kMmap,
};

// "copy" | "mmap"; InvalidArgument naming --load otherwise.
absl::StatusOr<LoadMode> ParseLoadMode(absl::string_view name);

// One opened safetensors file: only a regular file is opened (a FIFO, directory or device is
// refused, without blocking), and its header is validated before anything else is read.
// kCopy: the file stays open and Get preads the tensor into new memory. kMmap: the file is mapped
// read-only (PROT_READ) once; Get returns zero-copy CPU views whose storage holds a reference to
// the mapping, so tensors may outlive this object. The views are read-only memory: write into a
// clone, never in place. A tensor whose bytes are not aligned to its element size (a foreign
// writer's odd header length) is copied instead. Thread-safe after Open (all methods are const).
class SafetensorsFile {
 public:
  // Opens `path` and validates its header (ParseSafetensorsHeaderJson): the errors of
  // OpenRegularFile (NotFound; InvalidArgument for a FIFO, directory or device), and
  // InvalidArgument naming the file (and tensor) for a header that is too long or does not match
  // the file's size. Internal when a read or mmap fails.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                               LoadMode mode = LoadMode::kCopy);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return header_.entries.count(name) > 0; }
  // The header entry of `name`, or nullptr.
  const TensorInfo* info(const std::string& name) const;
  // Tensor `name`: a view of the mapping (kMmap) or a new tensor read from the file (kCopy).
  // NotFound naming the file and tensor if absent; kCopy: Internal naming them when the file has
  // changed since Open (shorter, or a read fails), ResourceExhausted when memory runs out.
  absl::StatusOr<torch::Tensor> Get(const std::string& name) const;
  // The header's `__metadata__` (string to string), empty if absent.
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::string& path() const { return path_; }
  LoadMode mode() const { return mode_; }
  // The mapped bytes (the whole file), to tell whether a tensor is a view of this file; {nullptr,
  // 0} in kCopy mode.
  std::pair<const uint8_t*, size_t> mapping() const;
  // True when `t`'s bytes lie inside this file's mapping (a zero-copy view); never in kCopy mode.
  bool IsViewOf(const torch::Tensor& t) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  absl::StatusOr<torch::Tensor> Read(const std::string& name, const TensorInfo& t) const;
  absl::StatusOr<torch::Tensor> View(const std::string& name, const TensorInfo& t) const;

  std::string path_;
  LoadMode mode_ = LoadMode::kCopy;
  ScopedFd fd_;                             // kCopy: read by Get
  std::shared_ptr<const Mapping> mapping_;  // kMmap
  SafetensorsHeader header_;
};

// Writes `tensors` (any device and layout; written as contiguous CPU bytes) to `path`
// deterministically: `__metadata__` first, then tensors by name, compact ASCII JSON padded with
// spaces to 8 bytes (the layout of tests/reference/make_tiny.py). InvalidArgument for a duplicate
// name or an unsupported dtype; Internal when the file cannot be written.
absl::Status WriteSafetensors(const std::string& path,
                              std::vector<std::pair<std::string, torch::Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace praxis::wire
