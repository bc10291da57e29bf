#include "client/client_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "the server, HOST:PORT");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "deadline of each call");
ABSL_FLAG(bool, whole_answer, true,
          "ask for each answer in one message where it fits the server's chunk size (false: the "
          "stream of header, chunks and trailer, as older clients read it)");
ABSL_FLAG(bool, tls, false, "connect with TLS (system roots unless --tls_ca)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots to verify the server with; implies --tls");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for servers that require one");
ABSL_FLAG(std::string, tls_key, "", "PEM client key");
ABSL_FLAG(std::string, tls_server_name, "", "name to check the server certificate against");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the bearer token sent on every call (servers with "
          "--auth_token_file)");
ABSL_FLAG(bool, resend_session_text, false,
          "send each Session step's text even where the server keeps it (its answers' text_kept): "
          "for measuring what leaving it out saves");

namespace praxis::client {

ClientOptions ClientOptionsFromFlags() {
  ClientOptions o;
  o.tls = absl::GetFlag(FLAGS_tls);
  o.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.resend_session_text = absl::GetFlag(FLAGS_resend_session_text);
  return o;
}

}  // namespace praxis::client
