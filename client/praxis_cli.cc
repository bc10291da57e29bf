// praxis-cli: talks to praxis-server.
//   praxis-cli info   --address=HOST:PORT
//   praxis-cli health --address=HOST:PORT [--service=NAME]      exit 0 iff SERVING
//   praxis-cli step   --address=HOST:PORT (--inputs=FILE | --layout=L,h,w,K,F [--batch=B --seed=S])
//                     --out=FILE [--outputs=velocity,taps,...] [--wire_dtype=float32] ...
// Exit status: 0 success, 1 the server answered an error (or not SERVING), 2 bad usage or input.

#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/client_flags.h"
#include "client/praxis_client.h"
#include "client/request_builder.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/usage.h"
#include "wire/layout_key.h"
#include "wire/safetensors.h"
#include "wire/selection.h"
#include "wire/step_file.h"
#include "wire/synthetic.h"

ABSL_FLAG(std::string, service, "", "health: the service to ask about (\"\" = the server)");
ABSL_FLAG(std::string, inputs, "",
          "step: safetensors with text, anchor, [clean], noised, timesteps, [frames_per_chunk]");
ABSL_FLAG(std::string, layout, "", "step: synthetic inputs for text_len,h,w,K,F instead");
ABSL_FLAG(int64_t, batch, 1, "step: rows of the synthetic inputs");
ABSL_FLAG(uint64_t, seed, 0, "step: seed of the synthetic inputs");
ABSL_FLAG(int64_t, frames_per_chunk, 0, "step: F; 0 takes it from --inputs or --layout");
ABSL_FLAG(bool, decode, true, "step: run the decoder tower");
ABSL_FLAG(std::string, rope_shifts, "0,0,0,0", "step: encoder anchor, text, video, decoder");
ABSL_FLAG(std::string, outputs, "velocity,cond,taps,embeddings,positions",
          "step: comma-separated velocity, cond, taps, tap.N, embeddings, positions");
ABSL_FLAG(std::string, wire_dtype, "float32", "step: float32 | bfloat16 | float16 outputs");
ABSL_FLAG(std::string, out, "", "step: safetensors file for every returned output");

namespace praxis::client {
namespace {

// Marks an error that came from the server (exit status 1), not from our input (2).
absl::Status Remote(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("server: ", s.message()));
}

absl::Status Info(const Client& c) {
  absl::StatusOr<v1::ModelInfo> info = c.Info(absl::GetFlag(FLAGS_timeout));
  if (!info.ok()) return Remote(info.status());
  const v1::ModelInfo& i = *info;
  std::cout << "model: " << i.model() << "\ndtype: " << i.dtype() << "\ndevice: " << i.device()
            << "\ncompute: " << i.compute() << "\nmax_batch_rows: " << i.max_batch_rows()
            << "\nmax_request_rows: " << i.max_request_rows()
            << "\nmax_text_len: " << i.max_text_len() << "\nmax_grid: " << i.max_grid_h() << " x "
            << i.max_grid_w() << "\nmax_frames: " << i.max_frames()
            << "\nmax_tokens: " << i.max_tokens() << "\nmax_chunk_bytes: " << i.max_chunk_bytes()
            << "\noutputs: " << absl::StrJoin(i.outputs(), ", ") << "\nconfig: " << i.config_json()
            << std::endl;
  return absl::OkStatus();
}

absl::Status Health(const Client& c) {
  const auto answered = c.Health(absl::GetFlag(FLAGS_service), absl::GetFlag(FLAGS_timeout));
  if (!answered.ok()) return Remote(answered.status());
  const auto status = *answered;
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(status);
  std::cout << name << std::endl;
  if (status != grpc::health::v1::HealthCheckResponse::SERVING) {
    return Remote(absl::UnavailableError(name));
  }
  return absl::OkStatus();
}

// The step's inputs from --inputs, or synthetic ones for --layout on the server's model.
absl::StatusOr<wire::StepInputs> Inputs(const Client& c) {
  const std::string file = absl::GetFlag(FLAGS_inputs), layout = absl::GetFlag(FLAGS_layout);
  if (file.empty() == layout.empty()) {
    return absl::InvalidArgumentError("step: give exactly one of --inputs and --layout");
  }
  wire::StepInputs in;
  if (!file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(in, wire::ReadStepInputs(file, absl::GetFlag(FLAGS_frames_per_chunk)));
  } else {
    PRAXIS_ASSIGN_OR_RETURN(const wire::StepGeometry l, wire::ParseLayout(layout, "--layout"));
    const absl::StatusOr<v1::ModelInfo> info = c.Info(absl::GetFlag(FLAGS_timeout));
    if (!info.ok()) return Remote(info.status());
    in = wire::SyntheticInputs(StepDimsOf(*info), l, absl::GetFlag(FLAGS_batch),
                               absl::GetFlag(FLAGS_seed));
    if (absl::GetFlag(FLAGS_frames_per_chunk) > 0) {
      in.frames_per_chunk = absl::GetFlag(FLAGS_frames_per_chunk);
    }
  }
  in.decode = absl::GetFlag(FLAGS_decode);
  PRAXIS_ASSIGN_OR_RETURN(in.rope_shifts,
                          wire::ParseRopeShifts(absl::GetFlag(FLAGS_rope_shifts), "--rope_shifts"));
  return in;
}

absl::Status Step(const Client& c) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("step: give --out");
  // Refused before sending: a path the answer cannot be written to would lose a computed step.
  if (IsDirectory(out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out: ", out, " is a directory; expected the path of the safetensors file to write"));
  }
  PRAXIS_ASSIGN_OR_RETURN(const wire::StepInputs in, Inputs(c));
  RequestOptions options;
  options.outputs = absl::StrSplit(absl::GetFlag(FLAGS_outputs), ',', absl::SkipEmpty());
  PRAXIS_ASSIGN_OR_RETURN(options.wire_dtype,
                          wire::ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype)));
  options.request_id = "praxis-cli";
  options.whole_answer = absl::GetFlag(FLAGS_whole_answer);
  PRAXIS_ASSIGN_OR_RETURN(const v1::StepRequest request, MakeStepRequest(in, options));
  absl::StatusOr<StepReply> answered = c.Step(request, absl::GetFlag(FLAGS_timeout));
  if (!answered.ok()) return Remote(answered.status());
  StepReply& reply = *answered;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const v1::TensorHeader& t : reply.header.tensors()) {
    tensors.emplace_back(t.name(), reply.tensors.at(t.name()));
  }
  const v1::StepHeader& h = reply.header;
  const std::map<std::string, std::string> metadata = {
      {"layout_key", h.layout_key()},
      {"queue_us", absl::StrCat(h.queue_us())},
      {"compute_us", absl::StrCat(h.compute_us())},
      {"batch_rows", absl::StrCat(h.batch_rows())},
      {"noised_span", absl::StrCat(h.noised_span().start(), ",", h.noised_span().length())}};
  if (absl::Status written = wire::WriteSafetensors(out, tensors, metadata); !written.ok()) {
    return absl::Status(written.code(), absl::StrCat("--out: ", written.message()));
  }
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  std::cout << "step ok: layout " << h.layout_key() << ", queue " << h.queue_us() / 1e3
            << " ms, compute " << h.compute_us() / 1e3 << " ms, total "
            << reply.trailer.total_us() / 1e3 << " ms, batch rows " << h.batch_rows() << "; "
            << absl::StrJoin(names, ", ") << " -> " << out << std::endl;
  return absl::OkStatus();
}

int Main(const std::vector<char*>& args) {
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command != "info" && command != "health" && command != "step") {
    std::cerr << "usage: praxis-cli info|health|step [flags]; see --help" << std::endl;
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Create(absl::GetFlag(FLAGS_address), ClientOptionsFromFlags());
  absl::Status s = c.status();
  if (s.ok()) s = command == "info" ? Info(**c) : command == "health" ? Health(**c) : Step(**c);
  if (s.ok()) return 0;
  std::cerr << "praxis-cli " << command << ": " << s << std::endl;
  return absl::StartsWith(s.message(), "server: ") ? 1 : 2;
}

}  // namespace
}  // namespace praxis::client

int main(int argc, char** argv) {
  praxis::SetUsage("praxis-cli info|health|step --address=HOST:PORT [flags]");
  return praxis::client::Main(absl::ParseCommandLine(argc, argv));
}
