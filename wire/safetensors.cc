#include "wire/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace praxis::wire {
namespace {

absl::Status InFile(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

// Reads exactly `n` bytes at `offset` of `fd` into `dst`; Internal when the file ends first (it
// shrank since its size was taken) or a read fails.
absl::Status PreadExactly(int fd, uint64_t offset, void* dst, uint64_t n) {
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::InternalError(absl::StrCat("read failed: ", strerror(errno)));
    if (got == 0) {
      return absl::InternalError(absl::StrCat("the file ended at byte ", offset + done,
                                              ", expected ", n - done,
                                              " more (truncated since "
                                              "it was opened?)"));
    }
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

// The validated header of the open regular file `fd`, of `file_bytes` bytes.
absl::StatusOr<SafetensorsHeader> ReadHeader(int fd, uint64_t file_bytes) {
  char length[8] = {};
  if (file_bytes >= 8) PRAXIS_RETURN_IF_ERROR(PreadExactly(fd, 0, length, 8));
  PRAXIS_ASSIGN_OR_RETURN(const uint64_t n,
                          ParseSafetensorsHeaderLength(absl::string_view(length, 8), file_bytes));
  std::string json(n, '\0');
  PRAXIS_RETURN_IF_ERROR(PreadExactly(fd, 8, json.data(), n));
  return ParseSafetensorsHeaderJson(json, file_bytes);
}

}  // namespace

absl::StatusOr<LoadMode> ParseLoadMode(absl::string_view name) {
  if (name == "copy") return LoadMode::kCopy;
  if (name == "mmap") return LoadMode::kMmap;
  return absl::InvalidArgumentError(
      absl::StrCat("--load: expected copy or mmap, got \"", name, "\""));
}

// A read-only mapping of a whole file; unmapped when the last tensor view (or the file) lets go.
struct SafetensorsFile::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;

  ~Mapping() {
    if (data != nullptr) munmap(const_cast<uint8_t*>(data), size);
  }
};

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       LoadMode mode) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mode_ = mode;
  PRAXIS_ASSIGN_OR_RETURN(file->fd_, OpenRegularFile(path));
  struct stat st;
  if (fstat(file->fd_.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": fstat failed: ", strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  absl::StatusOr<SafetensorsHeader> header = ReadHeader(file->fd_.get(), size);
  if (!header.ok()) return InFile(path, header.status());
  file->header_ = *std::move(header);
  if (mode == LoadMode::kCopy) return file;
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file->fd_.get(), 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", strerror(errno)));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->data = static_cast<const uint8_t*>(p);
  mapping->size = size;
  file->mapping_ = std::move(mapping);
  file->fd_.Reset();  // the mapping outlives the descriptor
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(header_.entries.size());
  for (const auto& [name, info] : header_.entries) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsFile::info(const std::string& name) const {
  auto it = header_.entries.find(name);
  return it == header_.entries.end() ? nullptr : &it->second;
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Get(const std::string& name) const {
  const TensorInfo* t = info(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  try {
    return mode_ == LoadMode::kCopy ? Read(name, *t) : View(name, *t);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(path_, ": tensor '", name, "': ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path_, ": tensor '", name, "': out of memory for ", t->end - t->begin, " bytes"));
  }
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Read(const std::string& name,
                                                    const TensorInfo& t) const {
  torch::Tensor out = torch::empty(t.shape, torch::TensorOptions().dtype(t.dtype));
  absl::Status read =
      PreadExactly(fd_.get(), header_.data_start + t.begin, out.data_ptr(), t.end - t.begin);
  if (!read.ok()) return InFile(path_, InFile(absl::StrCat("tensor '", name, "'"), read));
  return out;
}

absl::StatusOr<torch::Tensor> SafetensorsFile::View(const std::string& name,
                                                    const TensorInfo& t) const {
  uint8_t* p = const_cast<uint8_t*>(mapping_->data + header_.data_start + t.begin);
  // The deleter's copy of the mapping is what keeps the bytes mapped while the view lives.
  torch::Tensor view = torch::from_blob(
      p, t.shape, [keep = mapping_](void*) mutable { keep.reset(); },
      torch::TensorOptions().dtype(t.dtype));
  if (reinterpret_cast<uintptr_t>(p) % c10::elementSize(t.dtype) != 0) return view.clone();
  return view;
}

std::pair<const uint8_t*, size_t> SafetensorsFile::mapping() const {
  if (mapping_ == nullptr) return {nullptr, 0};
  return {mapping_->data, mapping_->size};
}

bool SafetensorsFile::IsViewOf(const torch::Tensor& t) const {
  if (mapping_ == nullptr || !t.defined() || !t.device().is_cpu()) return false;
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return p >= mapping_->data && p + t.nbytes() <= mapping_->data + mapping_->size;
}

namespace {

// The header JSON (padded to 8 bytes) and the blobs of `tensors`, sorted by name.
absl::StatusOr<std::string> BuildHeader(std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;  // std::map: keys sorted
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    if (header.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' given twice"));
    }
    PRAXIS_ASSIGN_OR_RETURN(std::string code, SafetensorsDtypeName(t.scalar_type()));
    t = t.detach().to(torch::kCPU).contiguous();
    const uint64_t n = t.nbytes();
    header[name] = {
        {"dtype", code}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump(-1, ' ', /*ensure_ascii=*/true);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              std::vector<std::pair<std::string, torch::Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string header;
  try {
    PRAXIS_ASSIGN_OR_RETURN(header, BuildHeader(tensors, metadata));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(path, ": ", e.what_without_backtrace()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  const uint64_t header_bytes = header.size();
  char length[8];
  std::memcpy(length, &header_bytes, 8);
  out.write(length, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : tensors) {
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace praxis::wire
