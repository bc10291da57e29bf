#include "client/praxis_client.h"

#include <google/protobuf/util/field_mask_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/request_builder.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "wire/layout_key.h"

namespace praxis::client {
namespace {

// Every field of a StepRequest but its text: what a Session step that leaves its text out sends
// (copied field by field, so the text's bytes are not copied only to be dropped).
const google::protobuf::FieldMask& AllButText() {
  static const google::protobuf::FieldMask* mask = [] {
    auto* m = new google::protobuf::FieldMask;
    const google::protobuf::Descriptor* d = v1::StepRequest::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      if (d->field(i)->number() != v1::StepRequest::kTextFieldNumber) {
        m->add_paths(d->field(i)->name());
      }
    }
    return m;
  }();
  return *mask;
}

std::chrono::system_clock::time_point After(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const ClientOptions& o) {
  if (!o.tls && o.tls_ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca_file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFileToString(o.tls_ca_file));
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key: expected both or neither");
  }
  if (!o.tls_cert_file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFileToString(o.tls_cert_file));
    PRAXIS_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFileToString(o.tls_key_file));
  }
  return grpc::SslCredentials(ssl);
}

// The token of `o`: `token`, or the first non-blank line of `token_file`.
absl::StatusOr<std::string> Token(const ClientOptions& o) {
  std::string token = o.token;
  if (token.empty() && !o.token_file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(o.token_file));
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (!line.empty() && !absl::StartsWith(line, "#")) {
        token = std::string(line);
        break;
      }
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(o.token_file, ": no token in the file"));
    }
  }
  // gRPC would refuse such a header value at call time; say so at once instead.
  for (const char c : token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("token: expected printable ASCII characters only");
    }
  }
  return token;
}

void AddToken(grpc::ClientContext& ctx, const std::string& token) {
  if (!token.empty()) ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& address,
                                                       const ClientOptions& options) {
  PRAXIS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds, Credentials(options));
  ClientOptions resolved = options;
  PRAXIS_ASSIGN_OR_RETURN(resolved.token, Token(options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_receive_bytes));
  args.SetMaxSendMessageSize(-1);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return std::unique_ptr<Client>(
      new Client(grpc::CreateCustomChannel(address, creds, args), std::move(resolved)));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::Praxis::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      options_(std::move(options)) {}

absl::StatusOr<StepReply> Client::Step(const v1::StepRequest& request,
                                       absl::Duration timeout) const {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  absl::Duration backoff = options_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<StepReply> r = StepOnce(request, timeout);
    // StepOnce's own cancels (a protocol error) return DataLoss, so a CANCELLED is the far side's.
    const bool retried = !r.ok() && (r.status().code() == absl::StatusCode::kUnavailable ||
                                     r.status().code() == absl::StatusCode::kCancelled);
    if (!retried || attempt >= options_.max_attempts) {
      return r;
    }
    const double jitter = std::uniform_real_distribution<double>(0.5, 1.0)(rng);
    absl::SleepFor(backoff * jitter);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void Client::Prepare(grpc::ClientContext& ctx, absl::Duration timeout) const {
  ctx.set_deadline(After(timeout));
  AddToken(ctx, options_.token);
}

absl::StatusOr<StepReply> Client::StepOnce(const v1::StepRequest& request,
                                           absl::Duration timeout) const {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout);
  if (const std::string key = LayoutKeyOf(request); !key.empty()) {
    ctx.AddMetadata(wire::kLayoutHeader, key);
  }
  std::unique_ptr<grpc::ClientReader<v1::StepResponse>> reader = stub_->Step(&ctx, request);
  StepAssembler assembler;
  v1::StepResponse msg;
  absl::Status protocol;
  bool complete = false;
  while (reader->Read(&msg)) {
    absl::StatusOr<bool> done = assembler.Add(msg);
    if (!done.ok()) {
      protocol = done.status();
      ctx.TryCancel();
      break;
    }
    complete = *done;
  }
  const absl::Status status = FromGrpc(reader->Finish());
  if (!protocol.ok()) return protocol;
  PRAXIS_RETURN_IF_ERROR(status);
  if (!complete) return absl::DataLossError("the stream ended without a trailer");
  return assembler.Take();
}

absl::StatusOr<v1::ModelInfo> Client::Info(absl::Duration timeout) const {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout);
  v1::ModelInfo info;
  PRAXIS_RETURN_IF_ERROR(FromGrpc(stub_->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info)));
  return info;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(
    const std::string& service, absl::Duration timeout) const {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  PRAXIS_RETURN_IF_ERROR(FromGrpc(health_->Check(&ctx, req, &resp)));
  return resp.status();
}

std::unique_ptr<Session> Client::OpenSession(absl::Duration timeout) const {
  return std::make_unique<Session>(*stub_, timeout, options_.token, options_.resend_session_text);
}

Session::Session(v1::Praxis::Stub& stub, absl::Duration timeout, const std::string& token,
                 bool resend_text)
    : resend_text_(resend_text) {
  ctx_.set_deadline(After(timeout));
  AddToken(ctx_, token);
  stream_ = stub.Session(&ctx_);
}

Session::~Session() {
  if (!closed_) {
    ctx_.TryCancel();
    stream_->Finish().IgnoreError();
  }
}

absl::StatusOr<StepReply> Session::Step(const v1::StepRequest& request) {
  if (closed_) return absl::FailedPreconditionError("the session is closed");
  if (!broken_.ok()) return broken_;
  const bool leave_out =
      !resend_text_ && kept_text_.has_value() && request.has_text() &&
      google::protobuf::util::MessageDifferencer::Equals(request.text(), *kept_text_);
  std::optional<v1::StepRequest> light;
  if (leave_out) {
    light.emplace();
    google::protobuf::util::FieldMaskUtil::MergeMessageTo(
        request, AllButText(), google::protobuf::util::FieldMaskUtil::MergeOptions(), &*light);
  }
  // Until this step's answer says otherwise; a failed step sends its text next time.
  std::optional<v1::Tensor> kept = std::exchange(kept_text_, std::nullopt);
  StepAssembler assembler;
  v1::StepResponse msg;
  if (stream_->Write(leave_out ? *light : request)) {
    while (stream_->Read(&msg)) {
      absl::StatusOr<bool> done = assembler.Add(msg);
      if (!done.ok()) {
        if (msg.has_error()) return done.status();  // this step failed; the session goes on
        broken_ = done.status();
        ctx_.TryCancel();
        return broken_;
      }
      if (!*done) continue;
      StepReply reply = assembler.Take();
      if (reply.header.text_kept() && !resend_text_) {
        if (leave_out) {
          kept_text_ = std::move(kept);
        } else if (request.has_text()) {
          kept_text_ = request.text();
        }
      }
      return reply;
    }
  }
  // The stream ended: its final status says why.
  closed_ = true;
  broken_ = FromGrpc(stream_->Finish());
  if (broken_.ok()) broken_ = absl::DataLossError("the session ended mid-step");
  return broken_;
}

absl::Status Session::Close() {
  if (closed_) return broken_;
  closed_ = true;
  stream_->WritesDone();
  v1::StepResponse msg;
  while (stream_->Read(&msg)) {
  }
  return FromGrpc(stream_->Finish());
}

absl::StatusOr<std::vector<std::unique_ptr<Client>>> LoadClients(const std::string& address,
                                                                 ClientOptions options,
                                                                 int connections, int streams) {
  options.max_attempts = 1;
  options.own_connection = true;
  const int needed = (streams + kStreamsPerConnection - 1) / kStreamsPerConnection;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < std::max(connections, needed); ++i) {
    PRAXIS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(address, options));
    clients.push_back(std::move(client));
  }
  return clients;
}

absl::StatusOr<Transport> ParseTransport(const std::string& name, Transport if_empty) {
  if (name.empty()) return if_empty;
  if (name == "session") return Transport::kSession;
  if (name == "unary") return Transport::kUnary;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport: expected session or unary, got \"", name, "\""));
}

const char* TransportName(Transport t) { return t == Transport::kSession ? "session" : "unary"; }

absl::StatusOr<StepReply> StepCaller::Step(const v1::StepRequest& request) {
  if (transport_ == Transport::kUnary) {
    const absl::Duration left = std::min(call_timeout_, hard_end_ - absl::Now());
    return client_->Step(request, std::max(left, absl::Milliseconds(1)));
  }
  if (!session_) session_ = client_->OpenSession(hard_end_ - absl::Now());
  absl::StatusOr<StepReply> r = session_->Step(request);
  if (!r.ok()) session_.reset();
  return r;
}

void StepCaller::Close() {
  if (session_) session_->Close().IgnoreError();
  session_.reset();
}

}  // namespace praxis::client
