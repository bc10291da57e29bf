// libFuzzer target for the safetensors parser (wire/safetensors.h): the input is a whole
// safetensors file (8-byte header length, JSON header, data), as a checkpoint from an untrusted hub
// could be.
//
// The input goes through SafetensorsFile::Open(path), the loader's own entry point (header parser,
// regular-file check, copy into memory), via one memfd (no disk, no temporary files to clean up)
// opened through /proc/self/fd; ParseSafetensorsHeader(bytes) is the header parser alone.
//
// Beyond not crashing, what Open accepts must hold what SPEC section 12 asks of a checkpoint: every
// tensor's byte range inside the data region and exactly numel * element size long, and no two
// tensors sharing a byte. Each accepted tensor is then read whole, so a view outside the mapping
// faults here rather than in a running server.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "wire/safetensors.h"

namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzzer: %s\n", what.c_str());
  std::abort();
}

// The parser under test, given the file's bytes.
absl::StatusOr<std::unique_ptr<praxis::wire::SafetensorsFile>> Parse(const uint8_t* data,
                                                                     size_t size) {
  static const int fd = [] {
    const int fd = memfd_create("safetensors_fuzzer", MFD_CLOEXEC);
    if (fd < 0) Fail("memfd_create failed");
    return fd;
  }();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    Fail("cannot write the memfd");
  }
  return praxis::wire::SafetensorsFile::Open(path);
}

void CheckAccepted(const praxis::wire::SafetensorsFile& file, const uint8_t* data, size_t size) {
  uint64_t header_bytes = 0;  // little-endian, as the format and this host are
  std::copy_n(data, 8, reinterpret_cast<uint8_t*>(&header_bytes));
  const uint64_t data_bytes = size - 8 - header_bytes;  // Open checked header_bytes <= size - 8
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const std::string& name : file.names()) {
    const praxis::wire::TensorInfo* info = file.info(name);
    if (info == nullptr) Fail("a listed name has no entry");
    if (info->begin > info->end || info->end > data_bytes) Fail("range outside the data: " + name);
    uint64_t numel = 1;
    for (int64_t d : info->shape) numel *= static_cast<uint64_t>(d);  // wraps only if Open erred
    if (info->end - info->begin != numel * c10::elementSize(info->dtype)) {
      Fail("range length does not match the shape: " + name);
    }
    if (info->end > info->begin) ranges.emplace_back(info->begin, info->end);
    absl::StatusOr<torch::Tensor> t = file.Get(name);
    if (!t.ok()) Fail("Get refused an accepted tensor: " + t.status().ToString());
    // Every byte of the view read once: a view beyond the mapping faults here.
    const torch::Tensor bytes = t->contiguous();
    const auto* p = static_cast<const volatile uint8_t*>(bytes.data_ptr());
    uint8_t sum = 0;
    for (size_t i = 0; i < bytes.nbytes(); ++i) sum += p[i];
    (void)sum;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) Fail("two tensors share bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::unique_ptr<praxis::wire::SafetensorsFile>> file = Parse(data, size);
  if (file.ok()) CheckAccepted(**file, data, size);
  return 0;
}
