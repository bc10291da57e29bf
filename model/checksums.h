#pragma once

// SHA256SUMS in a checkpoint directory, as `sha256sum` writes it ("<64 hex>  <file>" per line; a
// '*' before the name for binary mode): when present, every file it lists must match.
//
// This catches a corrupted or partly replaced download. It is not authentication: whoever can
// change the weights on a hub can change SHA256SUMS too.

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace praxis::model {

// The name of the checksum file in a checkpoint directory.
inline constexpr char kChecksumFile[] = "SHA256SUMS";

// File name (relative to the directory, "./" removed) to lowercase hex digest, from the text of a
// SHA256SUMS. InvalidArgument "SHA256SUMS:<line>: ..." for a malformed line, an absolute name or
// one with a ".." component, or a file listed twice. Pure and thread-safe.
absl::StatusOr<std::map<std::string, std::string>> ParseSha256Sums(absl::string_view text);

// The lowercase hex SHA-256 of regular file `path`, read once in a stream (64 KiB at a time). The
// errors of OpenRegularFile; Internal when a read fails.
absl::StatusOr<std::string> Sha256File(const std::string& path);

// Verifies `dir`/SHA256SUMS if there is one: every file it lists is hashed and must match.
// nullopt when there is none; else the files it verified. Errors name the file: NotFound for a
// listed file that is missing, InvalidArgument "<file>: SHA-256 <got> does not match SHA256SUMS
// (<want>)", and those of ParseSha256Sums and Sha256File.
absl::StatusOr<std::optional<std::map<std::string, std::string>>> VerifyChecksums(
    const std::string& dir);

}  // namespace praxis::model
