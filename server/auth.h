#pragma once

#include <grpcpp/server_context.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace praxis::serve {

// The metadata key and scheme every authenticated call carries: `authorization: Bearer <token>`.
inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// Checks the bearer token of a call against the tokens of a file (--auth_token_file). Only the
// SHA-256 digests of the tokens are kept, and a presented token is hashed and compared with every
// digest in constant time, so neither the time taken nor the token's length tells an attacker
// how close a guess came. Immutable after Create: thread-safe.
class TokenAuthenticator {
 public:
  // Reads `path`: one token per line; surrounding whitespace, blank lines and lines starting with
  // '#' are ignored. NotFound for an unreadable file, InvalidArgument when it holds no token.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Create(const std::string& path);
  // The same from the file's contents (tests; `source` names it in errors).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromText(absl::string_view text,
                                                                      absl::string_view source);

  // OK iff the call's metadata holds `authorization: Bearer <one of the tokens>`; otherwise
  // Unauthenticated saying whether the token was missing, malformed or wrong (never which token
  // came close).
  absl::Status Check(const grpc::ServerContextBase& ctx) const;
  // The same for the value of an authorization header (nullptr: no header).
  absl::Status CheckHeader(const absl::string_view* header) const;

  size_t token_count() const { return digests_.size(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  explicit TokenAuthenticator(std::vector<Digest> digests) : digests_(std::move(digests)) {}
  static Digest Sha256(absl::string_view bytes);

  const std::vector<Digest> digests_;
};

}  // namespace praxis::serve
