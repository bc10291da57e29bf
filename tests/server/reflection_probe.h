#pragma once

// list_services over server reflection, as raw bytes over a generic call: a binary that links
// grpc++_reflection cannot also compile reflection.proto (README pitfalls).

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace praxis::serve::fixtures {

// The call's final status and the bytes of its one answer (which name the services).
struct ListServicesReply {
  grpc::Status status;
  std::string bytes;
};

// Sends list_services (ServerReflectionRequest field 7) on `channel`; bounded by `timeout`.
inline ListServicesReply ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                      absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto wait = [&cq] {
    void* tag;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  call->StartCall(nullptr);
  wait();
  const char list_services[] = {0x3a, 0x00};  // field 7, length-delimited, empty
  grpc::Slice slice(list_services, sizeof list_services);
  call->WriteLast(grpc::ByteBuffer(&slice, 1), grpc::WriteOptions(), nullptr);
  wait();
  grpc::ByteBuffer reply;
  call->Read(&reply, nullptr);
  ListServicesReply out;
  if (wait()) {
    std::vector<grpc::Slice> slices;
    if (reply.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        out.bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  call->Finish(&out.status, nullptr);
  wait();
  return out;
}

}  // namespace praxis::serve::fixtures
