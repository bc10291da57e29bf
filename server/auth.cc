#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace praxis::serve {

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Create(
    const std::string& path) {
  PRAXIS_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return FromText(text, path);
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromText(
    absl::string_view text, absl::string_view source) {
  std::vector<Digest> digests;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    digests.push_back(Sha256(line));
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected at least one token (one per line), found none"));
  }
  return std::unique_ptr<TokenAuthenticator>(new TokenAuthenticator(std::move(digests)));
}

TokenAuthenticator::Digest TokenAuthenticator::Sha256(absl::string_view bytes) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), d.data());
  return d;
}

absl::Status TokenAuthenticator::Check(const grpc::ServerContextBase& ctx) const {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(kAuthorizationHeader);
  if (it == metadata.end()) return CheckHeader(nullptr);
  const absl::string_view header(it->second.data(), it->second.size());
  return CheckHeader(&header);
}

absl::Status TokenAuthenticator::CheckHeader(const absl::string_view* header) const {
  if (header == nullptr) {
    return absl::UnauthenticatedError(
        "no bearer token: expected metadata 'authorization: Bearer <token>'");
  }
  // RFC 6750: the scheme is case-insensitive.
  const size_t prefix = sizeof(kBearerPrefix) - 1;
  if (header->size() <= prefix ||
      !absl::EqualsIgnoreCase(header->substr(0, prefix), kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer <token>'");
  }
  const Digest presented = Sha256(absl::StripAsciiWhitespace(header->substr(prefix)));
  // Every digest is compared, with no early exit, so the time does not say which one matched.
  int matched = 0;
  for (const Digest& d : digests_) {
    matched |= CRYPTO_memcmp(d.data(), presented.data(), d.size()) == 0;
  }
  if (!matched) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

}  // namespace praxis::serve
