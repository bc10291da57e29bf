// The real server on 127.0.0.1:0 with the tiny model, through the real client: what it serves is
// what the in-process model computes. (Serving itself is tested on the fake: server_test.cc.)

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/praxis_client.h"
#include "model/model_loader.h"
#include "model/step_runner.h"
#include "server/server.h"
#include "server/step_request.h"
#include "tests/server/server_steps.h"

namespace praxis::serve {
namespace {

using client::Client;
using client::StepReply;
using fixtures::kLayouts;
using fixtures::kTimeout;
using fixtures::MaxAbsDiff;

// With the server's default text cache: each row's text projected alone, in both.
std::unique_ptr<model::VideoBackbone> TinyModel() {
  return std::move(model::LoadModel({}, {.text_cache_entries = 64}).value().model);
}

class ModelServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_ = TinyModel().release();
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics_address = "";
    o.batch.max_batch_rows = 8;
    o.batch.max_queue_delay = absl::Milliseconds(20);
    o.service.max_chunk_bytes = 4096;
    o.max_message_bytes = 4 << 20;
    o.model = {"embedded:tiny", "cpu", "float32", "tiny"};
    o.config_json = model::kEmbeddedTinyConfig;
    server_ = PraxisServer::Create(o, std::make_unique<model::BackboneStepRunner>(TinyModel()))
                  .value()
                  .release();
    ASSERT_TRUE(server_->Warmup(kLayouts[0]).ok());
    client::ClientOptions co;
    co.max_attempts = 1;
    client_ = Client::Create(absl::StrCat("127.0.0.1:", server_->port()), co).value().release();
  }
  static void TearDownTestSuite() {
    server_->Drain(absl::Seconds(10));
    delete client_;
    delete server_;
    delete reference_;
  }

  static v1::StepRequest Request(const wire::StepGeometry& layout, uint64_t seed,
                                 bool decode = true, int64_t rows = 1) {
    return fixtures::Request(reference_->config(), layout, seed, decode, rows);
  }

  // What the in-process forward gives for `r`, by output name.
  static std::map<std::string, torch::Tensor> Expected(const v1::StepRequest& r) {
    const DecodedStep d = DecodeStepRequest(r, reference_->config()).value();
    return fixtures::ByName(reference_->Forward(d.inputs).value());
  }

  static absl::StatusOr<StepReply> Step(const v1::StepRequest& r) {
    return client_->Step(r, kTimeout);
  }

  static inline model::VideoBackbone* reference_ = nullptr;
  static inline PraxisServer* server_ = nullptr;
  static inline Client* client_ = nullptr;
};

TEST_F(ModelServerTest, ServedOutputsEqualTheInProcessForwardBitForBit) {
  int cases = 0;
  for (const wire::StepGeometry& l : kLayouts) {
    for (bool decode : {true, false}) {
      v1::StepRequest r = Request(l, 100 + cases, decode, /*rows=*/1 + cases % 2);
      if (cases % 3 == 2) {
        for (int64_t s : {3, 1, 4, 1}) r.add_rope_shifts(s);
      }
      ++cases;
      const absl::StatusOr<StepReply> reply = Step(r);
      ASSERT_TRUE(reply.ok()) << reply.status();
      const std::map<std::string, torch::Tensor> want = Expected(r);
      ASSERT_EQ(reply->tensors.size(), want.size());
      for (const auto& [name, expected] : want) {
        const torch::Tensor& got = reply->tensors.at(name);
        EXPECT_EQ(got.scalar_type(), expected.scalar_type()) << name;
        EXPECT_TRUE(torch::equal(got, expected))
            << name << " differs by " << MaxAbsDiff(got, expected);
      }
      EXPECT_EQ(reply->header.request_id(), r.request_id());
      EXPECT_EQ(reply->header.n_chunks(), l.k);
      EXPECT_EQ(reply->header.tokens_per_frame(), l.h * l.w);
      EXPECT_EQ(reply->header.has_clean_span(), l.k > 1);
      EXPECT_FALSE(reply->header.layout_key().empty());
    }
  }
}

TEST_F(ModelServerTest, BfloatWireDtypeCarriesTheRoundedOutputs) {
  v1::StepRequest r = Request(kLayouts[0], 7);
  r.set_wire_dtype(v1::BFLOAT16);
  const absl::StatusOr<StepReply> reply = Step(r);
  ASSERT_TRUE(reply.ok()) << reply.status();
  for (const auto& [name, expected] : Expected(r)) {
    const torch::Tensor& got = reply->tensors.at(name);
    if (name == "positions") {
      EXPECT_TRUE(torch::equal(got, expected));
    } else {
      EXPECT_EQ(got.scalar_type(), torch::kBFloat16) << name;
      EXPECT_TRUE(torch::equal(got, expected.to(torch::kBFloat16))) << name;
    }
  }
}

}  // namespace
}  // namespace praxis::serve
