#include "server/step_response.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "model/model_loader.h"
#include "server/step_batch.h"
#include "server/step_request.h"
#include "tests/server/malformed_requests.h"
#include "wire/layout_key.h"

namespace praxis::serve {
namespace {

// One real forward of the valid tiny request (B = 1), as the batch runner hands it over.
struct Answered {
  Answered(v1::StepRequest request, int64_t batch_rows = 1, int64_t row = 0) {
    model = std::move(model::LoadModel({}, {}).value().model);
    step = *DecodeStepRequest(request, model->config());
    std::vector<model::StepInputs> rows(batch_rows, step.inputs);
    std::vector<const model::StepInputs*> ptrs;
    for (const auto& r : rows) ptrs.push_back(&r);
    const model::BackboneOutput out = *model->Forward(StackSteps(ptrs));
    result = StepResult{SliceRows(out, row, 1), wire::LayoutKey(step.inputs), absl::Milliseconds(1),
                        absl::Milliseconds(2), batch_rows};
  }
  std::unique_ptr<model::VideoBackbone> model;
  DecodedStep step;
  StepResult result;
};

// Messages in order; chunks per tensor contiguous, each at most the limit and whole elements.
TEST(StepResponderTest, ChunksAreBoundedContiguousAndSumToThePlannedBytes) {
  for (const v1::DType wire : {v1::FLOAT32, v1::BFLOAT16}) {
    v1::StepRequest request = fixtures::Valid();
    request.set_wire_dtype(wire);
    request.mutable_outputs()->set_positions(true);
    Answered a(request);
    constexpr int64_t kChunk = 1000;
    auto responder = StepResponder::Create(a.result, a.step.outputs, "id", absl::Now(), kChunk);
    ASSERT_TRUE(responder.ok()) << responder.status();
    const int64_t positions = 57 * 8;
    EXPECT_EQ(responder->tensor_bytes(), a.step.outputs.response_bytes) << "planned = sent";
    std::vector<std::string> kinds;
    std::map<std::string, int64_t> received;
    v1::StepResponse msg;
    while (*responder->Next(&msg)) {
      if (msg.has_header()) kinds.push_back("header");
      if (msg.has_trailer()) kinds.push_back("trailer");
      if (!msg.has_chunk()) continue;
      const v1::TensorChunk& c = msg.chunk();
      EXPECT_LE(static_cast<int64_t>(c.data().size()), kChunk);
      EXPECT_EQ(c.offset(), received[c.name()]) << c.name();
      EXPECT_EQ(c.data().size() % (c.name() == "positions" ? 8 : wire == v1::FLOAT32 ? 4 : 2), 0u);
      received[c.name()] += static_cast<int64_t>(c.data().size());
    }
    EXPECT_EQ(kinds, (std::vector<std::string>{"header", "trailer"}));
    EXPECT_EQ(received["positions"], positions);
    int64_t total = 0;
    for (const auto& [name, n] : received) total += n;
    EXPECT_EQ(total, a.step.outputs.response_bytes);
  }
}

// Bytes on the wire equal the tensor converted to the wire dtype, whichever chunk they came in.
TEST(StepResponderTest, ChunkBytesAreTheTensorInTheWireDtype) {
  v1::StepRequest request = fixtures::Valid();
  request.set_wire_dtype(v1::BFLOAT16);
  Answered a(request, /*batch_rows=*/2);
  auto responder = StepResponder::Create(a.result, a.step.outputs, "id", absl::Now(), 64);
  ASSERT_TRUE(responder.ok());
  std::string velocity;
  v1::StepResponse msg;
  while (*responder->Next(&msg)) {
    if (msg.has_chunk() && msg.chunk().name() == "velocity") velocity += msg.chunk().data();
  }
  const torch::Tensor want = a.result.output.velocity.to(torch::kBFloat16).contiguous();
  ASSERT_EQ(velocity.size(), want.nbytes());
  EXPECT_EQ(velocity, std::string(static_cast<const char*>(want.data_ptr()), want.nbytes()));
}

// Every output, in every wire dtype and at chunk limits that are not a multiple of an element,
// arrives as the tensor's bytes converted to the wire dtype; the row is a view into a batch at a
// non-zero offset, as a second caller's rows are.
TEST(StepResponderTest, EveryWireDtypeAndChunkSizeSendsTheConvertedRow) {
  v1::StepRequest request = fixtures::Valid();
  request.mutable_outputs()->set_cond(true);
  request.mutable_outputs()->set_positions(true);
  for (const v1::DType wire : {v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16}) {
    request.set_wire_dtype(wire);
    Answered a(request, /*batch_rows=*/3, /*row=*/1);
    ASSERT_GT(a.result.output.cond.storage_offset(), 0) << "a view of the second row";
    const torch::ScalarType target = wire == v1::FLOAT32    ? torch::kFloat32
                                     : wire == v1::BFLOAT16 ? torch::kBFloat16
                                                            : torch::kFloat16;
    for (const int64_t chunk : {int64_t{9}, int64_t{1001}, int64_t{1} << 20}) {
      auto responder = StepResponder::Create(a.result, a.step.outputs, "id", absl::Now(), chunk);
      ASSERT_TRUE(responder.ok()) << responder.status();
      std::map<std::string, std::string> got;
      v1::StepResponse msg;
      while (*responder->Next(&msg)) {
        if (msg.has_chunk()) got[msg.chunk().name()] += msg.chunk().data();
      }
      const model::BackboneOutput& o = a.result.output;
      const std::pair<std::string, torch::Tensor> want[] = {
          {"velocity", o.velocity.to(target)},
          {"cond", o.cond.to(target)},
          {"tap.0", o.features.taps[0].to(target)},
          {"tap.1", o.features.taps[1].to(target)},
          {"positions", o.features.positions}};
      ASSERT_EQ(got.size(), std::size(want));
      for (const auto& [name, t] : want) {
        const torch::Tensor c = t.contiguous();
        EXPECT_EQ(got[name], std::string(static_cast<const char*>(c.data_ptr()), c.nbytes()))
            << name << " wire " << wire << " chunk " << chunk;
      }
    }
  }
}

// The messages of one answer: the stream's, or its one StepAnswer split back into them.
std::vector<v1::StepResponse> Messages(StepResponder& responder) {
  std::vector<v1::StepResponse> out;
  v1::StepResponse msg;
  while (*responder.Next(&msg)) {
    if (!msg.has_answer()) {
      out.push_back(msg);
      continue;
    }
    EXPECT_TRUE(responder.finished()) << "the whole answer is the last message";
    const v1::StepAnswer& a = msg.answer();
    out.emplace_back().mutable_header()->CopyFrom(a.header());
    for (const v1::TensorChunk& c : a.chunks()) out.emplace_back().mutable_chunk()->CopyFrom(c);
    out.emplace_back().mutable_trailer()->CopyFrom(a.trailer());
  }
  return out;
}

// Asked for, an answer whose tensor bytes fit in one chunk comes as one StepAnswer carrying the
// stream's header and chunks (the trailer's timing aside); one byte over, as the stream.
TEST(StepResponderTest, AWholeAnswerIsTheStreamInOneMessageWhereItFits) {
  v1::StepRequest request = fixtures::Valid();
  request.mutable_outputs()->set_cond(true);
  request.mutable_outputs()->set_positions(true);
  request.set_wire_dtype(v1::BFLOAT16);
  Answered a(request, /*batch_rows=*/2, /*row=*/1);
  OutputPlan whole = a.step.outputs;
  ASSERT_FALSE(whole.whole_answer) << "the fixture does not ask";
  whole.whole_answer = true;
  const int64_t bytes = a.step.outputs.response_bytes;
  for (const int64_t chunk : {bytes, bytes - 1}) {
    auto streamed = StepResponder::Create(a.result, a.step.outputs, "id", absl::Now(), chunk);
    auto answered = StepResponder::Create(a.result, whole, "id", absl::Now(), chunk);
    ASSERT_TRUE(streamed.ok() && answered.ok());
    v1::StepResponse first;
    ASSERT_TRUE(*answered->Next(&first));
    EXPECT_EQ(first.has_answer(), chunk == bytes) << "chunk limit " << chunk;
    answered = StepResponder::Create(a.result, whole, "id", absl::Now(), chunk);
    const std::vector<v1::StepResponse> want = Messages(*streamed), got = Messages(*answered);
    ASSERT_EQ(got.size(), want.size()) << "chunk limit " << chunk;
    ASSERT_GE(want.size(), 6u) << "header, four outputs, trailer";
    for (size_t i = 0; i + 1 < want.size(); ++i) {
      EXPECT_EQ(got[i].SerializeAsString(), want[i].SerializeAsString()) << "message " << i;
    }
    EXPECT_TRUE(got.back().has_trailer());
    v1::StepResponse after;
    EXPECT_FALSE(*answered->Next(&after)) << "nothing after the answer";
  }
}

TEST(StepResponderTest, RefusesAChunkLimitBelowOneElement) {
  Answered a(fixtures::Valid());
  EXPECT_EQ(StepResponder::Create(a.result, a.step.outputs, "", absl::Now(), 7).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace praxis::serve
