#pragma once

// The connection flags praxis-cli and praxis-load share: --address, --timeout and TLS.

#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(absl::Duration, timeout);

namespace praxis::client {

// ClientOptions from --tls, --tls_ca, --tls_cert, --tls_key and --tls_server_name.
ClientOptions ClientOptionsFromFlags();

}  // namespace praxis::client
