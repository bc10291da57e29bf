#include "model/checksums.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace praxis::model {
namespace {

// A SHA256SUMS is a few lines per file; anything much larger is not one.
constexpr int64_t kMaxChecksumFileBytes = int64_t{1} << 20;

bool IsHexDigest(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

// A name inside the directory: relative, without "..", "./" prefixes removed.
absl::StatusOr<std::string> CleanName(absl::string_view name) {
  while (absl::ConsumePrefix(&name, "./")) {
  }
  if (name.empty() || absl::StartsWith(name, "/")) {
    return absl::InvalidArgumentError("expected a file name relative to the checkpoint directory");
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") return absl::InvalidArgumentError("a file name may not contain '..'");
  }
  return std::string(name);
}

std::string Hex(const unsigned char* bytes, unsigned int n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 15]);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseSha256Sums(absl::string_view text) {
  std::map<std::string, std::string> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::ConsumeSuffix(&line, "\r");
    if (line.empty()) continue;
    const auto error = [line_number](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(kChecksumFile, ":", line_number, ": ", why));
    };
    // "<64 hex> <' ' or '*'><name>": sha256sum's text and binary modes.
    if (line.size() < 67 || !IsHexDigest(line.substr(0, 64)) || line[64] != ' ' ||
        (line[65] != ' ' && line[65] != '*')) {
      return error("expected '<64 hex digits>  <file>'");
    }
    absl::StatusOr<std::string> name = CleanName(line.substr(66));
    if (!name.ok()) return error(name.status().message());
    if (!out.emplace(*name, absl::AsciiStrToLower(line.substr(0, 64))).second) {
      return error(absl::StrCat("'", *name, "' is listed twice"));
    }
  }
  return out;
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  PRAXIS_ASSIGN_OR_RETURN(ScopedFd fd, OpenRegularFile(path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError(absl::StrCat(path, ": cannot start SHA-256"));
  }
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n)) != 1) {
      return absl::InternalError(absl::StrCat(path, ": SHA-256 failed"));
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_bytes = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &digest_bytes) != 1) {
    return absl::InternalError(absl::StrCat(path, ": SHA-256 failed"));
  }
  return Hex(digest, digest_bytes);
}

absl::StatusOr<std::optional<std::map<std::string, std::string>>> VerifyChecksums(
    const std::string& dir) {
  const std::string sums_path = JoinPath(dir, kChecksumFile);
  if (!PathExists(sums_path)) return std::nullopt;
  PRAXIS_ASSIGN_OR_RETURN(const std::string text,
                          ReadRegularFile(sums_path, kMaxChecksumFileBytes));
  absl::StatusOr<std::map<std::string, std::string>> sums = ParseSha256Sums(text);
  if (!sums.ok()) {
    return absl::Status(sums.status().code(), absl::StrCat(dir, "/", sums.status().message()));
  }
  for (const auto& [name, want] : *sums) {
    const std::string path = JoinPath(dir, name);
    PRAXIS_ASSIGN_OR_RETURN(const std::string got, Sha256File(path));
    if (got != want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": SHA-256 ", got, " does not match ",
                                                     kChecksumFile, " (", want, ")"));
    }
  }
  return *std::move(sums);
}

}  // namespace praxis::model
