#pragma once

// The flags praxis-cli and praxis-load share: --address, --timeout, TLS, the token, and how
// answers come back (--whole_answer).

#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, whole_answer);

namespace praxis::client {

// ClientOptions from --tls, --tls_ca, --tls_cert, --tls_key, --tls_server_name and --token_file.
ClientOptions ClientOptionsFromFlags();

}  // namespace praxis::client
