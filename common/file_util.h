#pragma once

// Small POSIX file helpers.
//
// Why not std::filesystem: libtorch.so exports its own copy of the std::filesystem functions
// (remove_all, create_directories, status, ...), and in a binary linked with it calls bind to that
// copy, which crashes (seen with LibTorch 2.11 and this toolchain's libstdc++). Code that links
// LibTorch uses these instead.

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace praxis
