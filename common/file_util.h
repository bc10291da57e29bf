#pragma once

// Small POSIX file helpers.
//
// Why not std::filesystem: libtorch.so exports its own copy of the std::filesystem functions
// (remove_all, create_directories, status, ...), and in a binary linked with it calls bind to that
// copy, which crashes (seen with LibTorch 2.11 and this toolchain's libstdc++). Code that links
// LibTorch uses these instead.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace praxis {

inline bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

inline bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// `dir`/`name`, without doubling a trailing slash.
inline std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : absl::StrCat(dir, "/", name);
}

// The last component of `path` ("a/b/c.json" -> "c.json").
inline std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The whole file as bytes; NotFound naming the file (and the system's reason) if unreadable.
inline absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return text.str();
}

// Replaces `path`'s contents with `bytes`; Internal naming the file (and the system's reason).
inline absl::Status WriteStringToFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  out << bytes;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

// Owns a file descriptor and closes it on destruction. Move-only; not thread-safe (the descriptor
// itself may be used from many threads with pread).
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~ScopedFd() { Reset(); }

  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// What a non-regular file is, for error messages.
inline const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens `path` (symlinks followed) read-only if it is a regular file. Checkpoints and configs may
// come from an untrusted hub: reading a FIFO blocks forever and a device may never end, so anything
// but a regular file is InvalidArgument "`path`: not a regular file (a FIFO)". The open itself is
// O_NONBLOCK, so a FIFO swapped in after the stat cannot block it either. NotFound naming the file
// (and the system's reason) when it cannot be opened.
inline absl::StatusOr<ScopedFd> OpenRegularFile(const std::string& path) {
  const auto not_regular = [&path](mode_t mode) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (", FileKind(mode), ")"));
  };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  // O_NONBLOCK means nothing to a regular file's reads; cleared so the descriptor is ordinary.
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// The whole of regular file `path` (see OpenRegularFile for what else is refused).
// InvalidArgument naming the file when it holds more than `max_bytes`: a config or an index has no
// reason to be large, and reading one must not exhaust memory; Internal when a read fails.
inline absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<ScopedFd> fd = OpenRegularFile(path);
  if (!fd.ok()) return fd.status();
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd->get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) return out;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than the limit of ", max_bytes, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace praxis
