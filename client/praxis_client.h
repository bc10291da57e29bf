#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/step_assembler.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "praxis/v1/praxis.grpc.pb.h"

namespace praxis::client {

// How a Client connects and retries.
struct ClientOptions {
  bool tls = false;           // TLS with the system roots, or tls_ca_file's
  std::string tls_ca_file;    // PEM roots; implies tls
  std::string tls_cert_file;  // PEM client certificate, for servers that require one
  std::string tls_key_file;
  std::string tls_server_name;  // overrides the name checked against the server's certificate
  std::string token;       // bearer token sent as `authorization: Bearer <token>` on every call
  std::string token_file;  // or a file whose first non-blank line is the token
  int max_attempts = 3;    // per call, counting the first; UNAVAILABLE and CANCELLED are retried
  absl::Duration initial_backoff = absl::Milliseconds(100);  // doubled per retry, with jitter
  absl::Duration max_backoff = absl::Seconds(2);
  int64_t max_receive_bytes = int64_t{64} << 20;  // per message (chunks are ≤ 1 MiB by default)
  bool own_connection = false;  // a TCP connection of its own, not shared with other Clients
  // Send a Session step's text even where the server keeps it (the answers' text_kept): for
  // measuring what leaving it out saves.
  bool resend_session_text = false;
};

// The gRPC status as an absl::Status (same codes, same message).
absl::Status FromGrpc(const grpc::Status& s);

class Session;

// A connection to praxis-server: typed calls over the generated stubs. Step is unary-style over
// the streaming Step call (the chunks are reassembled and checked); a UNAVAILABLE answer (server
// warming up, draining, or unreachable), or a CANCELLED from the far side (gRPC cancels the calls
// that reach a server, through a proxy, in the instant it shuts down), is retried with backoff: a
// step is a pure function of its request. Thread-safe: one Client serves many threads.
class Client {
 public:
  // NotFound for unreadable TLS or token files, InvalidArgument for an empty token file or a
  // token that cannot travel in a header. Connecting is lazy; the first call does it.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& address,
                                                        const ClientOptions& options = {});

  // One step, within `timeout` per attempt, sent with its layout key as kLayoutHeader. The
  // server's status, or DataLoss for a malformed answer.
  absl::StatusOr<StepReply> Step(const v1::StepRequest& request, absl::Duration timeout) const;
  absl::StatusOr<v1::ModelInfo> Info(absl::Duration timeout) const;
  // The grpc.health.v1 status of `service` ("" for the whole server).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service, absl::Duration timeout) const;
  // A Session stream for consecutive steps of one robot; `timeout` bounds the whole session.
  std::unique_ptr<Session> OpenSession(absl::Duration timeout) const;

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);
  absl::StatusOr<StepReply> StepOnce(const v1::StepRequest& request, absl::Duration timeout) const;
  // A context for one call: its deadline and, with a token, the authorization header.
  void Prepare(grpc::ClientContext& ctx, absl::Duration timeout) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Praxis::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const ClientOptions options_;
};

// One Session call: steps are sent and answered one at a time, in order. A failed step returns its
// error and the session goes on; a broken stream returns its final status from then on. A step's
// text equal to the one the server said it keeps (StepHeader.text_kept) is left out of the
// message: a robot's instruction crosses the wire once, not with every step. Not thread-safe
// (one robot, one control loop).
class Session {
 public:
  // `token`: sent as the bearer token when not empty. `resend_text`: never leave text out.
  Session(v1::Praxis::Stub& stub, absl::Duration timeout, const std::string& token = "",
          bool resend_text = false);
  ~Session();

  absl::StatusOr<StepReply> Step(const v1::StepRequest& request);
  // Half-closes and returns the call's final status.
  absl::Status Close();

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream_;
  bool closed_ = false;
  absl::Status broken_;
  const bool resend_text_;
  std::optional<v1::Tensor> kept_text_;  // what the server keeps for this session, per its answer
};

// The server admits 64 concurrent streams per connection by default
// (--max_streams_per_connection); the load tools keep well below that on each connection.
inline constexpr int kStreamsPerConnection = 32;

// Clients for a load run against `address`: `connections` of them, or more where `streams`
// long-lived streams need them to keep kStreamsPerConnection each; each on its own connection and
// never retrying (every failure shows in the report).
absl::StatusOr<std::vector<std::unique_ptr<Client>>> LoadClients(const std::string& address,
                                                                 ClientOptions options,
                                                                 int connections, int streams);

// How a caller's consecutive steps travel: on one Session stream, or as a unary Step call each.
enum class Transport { kSession, kUnary };

// "session" | "unary" (--transport), or `if_empty` for ""; InvalidArgument naming the flag
// otherwise.
absl::StatusOr<Transport> ParseTransport(const std::string& name, Transport if_empty);
const char* TransportName(Transport t);

// One caller's consecutive steps over `transport`: a unary Step call each (no retries beyond the
// Client's), or a Session opened on the first step and opened afresh after a failed one (the
// failure may have broken its stream). Every call and stream ends by `hard_end`. Borrows `client`;
// not thread-safe (one caller).
class StepCaller {
 public:
  StepCaller(const Client& client, Transport transport, absl::Duration call_timeout)
      : client_(&client), transport_(transport), call_timeout_(call_timeout) {}

  // Bounds the calls and streams that start from now on.
  void set_hard_end(absl::Time t) { hard_end_ = t; }
  absl::StatusOr<StepReply> Step(const v1::StepRequest& request);
  // Half-closes the caller's stream, if open; the next step opens a new one.
  void Close();

 private:
  const Client* client_;
  Transport transport_;
  absl::Duration call_timeout_;
  absl::Time hard_end_ = absl::InfiniteFuture();
  std::unique_ptr<Session> session_;
};

}  // namespace praxis::client
