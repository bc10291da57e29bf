#include "client/step_assembler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace praxis::client {
namespace {

v1::TensorHeader TensorHeaderOf(const std::string& name, int dtype, std::vector<int64_t> shape,
                                int64_t nbytes) {
  v1::TensorHeader t;
  t.set_name(name);
  t.set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) t.add_shape(d);
  t.set_nbytes(nbytes);
  return t;
}

v1::StepResponse Header(const std::vector<v1::TensorHeader>& tensors) {
  v1::StepResponse m;
  m.mutable_header()->set_layout_key("K1/F2");
  for (const v1::TensorHeader& t : tensors) *m.mutable_header()->add_tensors() = t;
  return m;
}

v1::StepResponse Chunk(const std::string& name, int64_t offset, std::string data) {
  v1::StepResponse m;
  m.mutable_chunk()->set_name(name);
  m.mutable_chunk()->set_offset(offset);
  m.mutable_chunk()->set_data(std::move(data));
  return m;
}

v1::StepResponse Trailer() {
  v1::StepResponse m;
  m.mutable_trailer()->set_queue_us(11);
  m.mutable_trailer()->set_compute_us(22);
  m.mutable_trailer()->set_total_us(33);
  return m;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

// velocity: float32 [2, 3] = 24 bytes; tap.0: int64 [2] = 16 bytes.
const std::vector<float> kVelocity = {1.5f, -2.0f, 3.25f, 4.0f, -5.5f, 6.0f};
const std::vector<int64_t> kTap = {7, -8};

v1::StepResponse TwoTensorHeader() {
  return Header({TensorHeaderOf("velocity", v1::FLOAT32, {2, 3}, 24),
                 TensorHeaderOf("tap.0", v1::INT64, {2}, 16)});
}

// Adds `msg` and expects it accepted but not final.
void AddPending(StepAssembler& a, const v1::StepResponse& msg) {
  absl::StatusOr<bool> r = a.Add(msg);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
}

// Expects `r` to be DataLoss whose message contains `needle`.
void ExpectDataLoss(const absl::StatusOr<bool>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << r.status();
}

TEST(StepAssemblerTest, AssemblesChunksInHeaderOrderAndCompletesOnTheTrailer) {
  StepAssembler a;
  AddPending(a, TwoTensorHeader());
  const std::string v = Bytes(kVelocity);
  AddPending(a, Chunk("velocity", 0, v.substr(0, 8)));
  AddPending(a, Chunk("velocity", 8, v.substr(8, 10)));
  AddPending(a, Chunk("velocity", 18, v.substr(18)));
  const std::string t = Bytes(kTap);
  AddPending(a, Chunk("tap.0", 0, t.substr(0, 5)));
  AddPending(a, Chunk("tap.0", 5, t.substr(5)));
  absl::StatusOr<bool> done = a.Add(Trailer());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);

  StepReply reply = a.Take();
  EXPECT_EQ(reply.header.layout_key(), "K1/F2");
  ASSERT_EQ(reply.header.tensors_size(), 2);
  EXPECT_EQ(reply.trailer.queue_us(), 11);
  EXPECT_EQ(reply.trailer.compute_us(), 22);
  EXPECT_EQ(reply.trailer.total_us(), 33);
  ASSERT_EQ(reply.tensors.size(), 2u);
  const torch::Tensor& vel = reply.tensors.at("velocity");
  EXPECT_EQ(vel.scalar_type(), torch::kFloat32);
  EXPECT_EQ(vel.sizes().vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(torch::equal(vel, torch::tensor(kVelocity).view({2, 3})));
  const torch::Tensor& tap = reply.tensors.at("tap.0");
  EXPECT_EQ(tap.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(tap, torch::tensor(kTap)));
}

TEST(StepAssemblerTest, TakeResetsTheAssemblerForTheNextStep) {
  StepAssembler a;
  AddPending(a, Header({}));
  ASSERT_TRUE(*a.Add(Trailer()));
  EXPECT_TRUE(a.Take().tensors.empty());
  // Reset: a header is required again, and a whole second step assembles.
  ExpectDataLoss(a.Add(Chunk("velocity", 0, "x")), "a chunk before the header");
  AddPending(a, Header({TensorHeaderOf("tap.0", v1::INT64, {2}, 16)}));
  AddPending(a, Chunk("tap.0", 0, Bytes(kTap)));
  ASSERT_TRUE(*a.Add(Trailer()));
  EXPECT_TRUE(torch::equal(a.Take().tensors.at("tap.0"), torch::tensor(kTap)));
}

TEST(StepAssemblerTest, ZeroByteTensorsNeedNoChunks) {
  StepAssembler a;
  AddPending(a, Header({TensorHeaderOf("empty.0", v1::FLOAT32, {0, 4}, 0),
                        TensorHeaderOf("tap.0", v1::INT64, {2}, 16),
                        TensorHeaderOf("empty.1", v1::BFLOAT16, {3, 0}, 0)}));
  AddPending(a, Chunk("tap.0", 0, Bytes(kTap)));
  ASSERT_TRUE(*a.Add(Trailer()));
  StepReply reply = a.Take();
  ASSERT_EQ(reply.tensors.size(), 3u);
  EXPECT_EQ(reply.tensors.at("empty.0").sizes().vec(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(reply.tensors.at("empty.1").sizes().vec(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(reply.tensors.at("empty.1").scalar_type(), torch::kBFloat16);
}

TEST(StepAssemblerTest, HeaderMustComeFirstAndOnlyOnce) {
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Chunk("velocity", 0, "abcd")), "a chunk before the header");
  }
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Trailer()), "a trailer before the header");
  }
  {
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    ExpectDataLoss(a.Add(TwoTensorHeader()), "a second header");
  }
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(v1::StepResponse()), "an empty StepResponse");
  }
}

TEST(StepAssemblerTest, TrailerIsLast) {
  StepAssembler a;
  AddPending(a, Header({}));
  ASSERT_TRUE(*a.Add(Trailer()));
  ExpectDataLoss(a.Add(Trailer()), "message after the trailer");
  ExpectDataLoss(a.Add(Chunk("velocity", 0, "x")), "message after the trailer");
}

TEST(StepAssemblerTest, StepErrorBecomesTheStatus) {
  v1::StepResponse err;
  err.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  err.mutable_error()->set_message("over the byte budget");
  {
    StepAssembler a;
    absl::StatusOr<bool> r = a.Add(err);
    EXPECT_EQ(r.status(), absl::ResourceExhaustedError("over the byte budget"));
  }
  {  // Mid-stream, after the header and a chunk.
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, Bytes(kVelocity).substr(0, 8)));
    err.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    err.mutable_error()->set_message("expired in queue");
    EXPECT_EQ(a.Add(err).status(), absl::DeadlineExceededError("expired in queue"));
  }
}

// A StepError saying OK once aborted the client (Abseil refuses an OK status as a StatusOr's
// error): a hostile server could kill praxis-cli or praxis-load with one message.
TEST(StepAssemblerTest, AStepErrorWithCodeOkIsRefused) {
  v1::StepResponse err;
  err.mutable_error()->set_code(0);
  err.mutable_error()->set_message("all fine, no data");
  StepAssembler a;
  EXPECT_EQ(a.Add(err).status(), absl::DataLossError("a StepError with code OK"));
}

struct HostileHeader {
  const char* label;
  v1::TensorHeader tensor;
  const char* needle;  // besides the tensor's name
};

TEST(StepAssemblerTest, RefusesHostileHeadersNamingTheTensor) {
  const int64_t k40 = int64_t{1} << 40;
  const std::vector<HostileHeader> cases = {
      {"negative dim", TensorHeaderOf("neg", v1::FLOAT32, {-1, 4}, 0), "negative or too large"},
      {"[2^62] float32", TensorHeaderOf("wrap", v1::FLOAT32, {int64_t{1} << 62}, 0),
       "negative or too large"},
      {"[2^62] bfloat16", TensorHeaderOf("wrap16", v1::BFLOAT16, {int64_t{1} << 62}, 0),
       "negative or too large"},
      {"[0, 2^40, 2^40]", TensorHeaderOf("zero_hides", v1::FLOAT32, {0, k40, k40}, 0),
       "negative or too large"},
      {"nbytes short", TensorHeaderOf("short", v1::FLOAT32, {2, 3}, 20),
       "header announces 20 bytes for shape [2, 3], which holds 24"},
      {"nbytes long", TensorHeaderOf("long", v1::INT64, {2}, 17),
       "header announces 17 bytes for shape [2], which holds 16"},
      {"dtype unspecified", TensorHeaderOf("nodtype", v1::DTYPE_UNSPECIFIED, {2}, 8), ".dtype"},
      {"dtype 99", TensorHeaderOf("baddtype", 99, {2}, 8), "got 99"},
      {"9 dims", TensorHeaderOf("deep", v1::FLOAT32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 4),
       "has more than 8 dimensions"},
  };
  for (const HostileHeader& c : cases) {
    SCOPED_TRACE(c.label);
    // Placed second, after a valid tensor: the whole header is refused.
    StepAssembler a;
    ExpectDataLoss(a.Add(Header({TensorHeaderOf("velocity", v1::FLOAT32, {2, 3}, 24), c.tensor})),
                   c.tensor.name());
    ExpectDataLoss(a.Add(Header({c.tensor})), c.needle);
    // Nothing of the refused header was kept.
    ExpectDataLoss(a.Add(Chunk("velocity", 0, Bytes(kVelocity))), "a chunk before the header");
  }
}

TEST(StepAssemblerTest, EightDimsAreAccepted) {
  StepAssembler a;
  AddPending(a, Header({TensorHeaderOf("deep", v1::FLOAT32, {1, 1, 1, 1, 1, 1, 1, 2}, 8)}));
  AddPending(a, Chunk("deep", 0, Bytes(std::vector<float>{1, 2})));
  ASSERT_TRUE(*a.Add(Trailer()));
  EXPECT_EQ(a.Take().tensors.at("deep").dim(), 8);
}

TEST(StepAssemblerTest, RefusesChunkOfUnknownTensor) {
  StepAssembler a;
  AddPending(a, TwoTensorHeader());
  absl::StatusOr<bool> r = a.Add(Chunk("bogus", 0, "abcd"));
  ExpectDataLoss(r, "chunk of bogus while velocity was incomplete");
}

TEST(StepAssemblerTest, RefusesChunkOutOfHeaderOrder) {
  StepAssembler a;
  AddPending(a, TwoTensorHeader());
  ExpectDataLoss(a.Add(Chunk("tap.0", 0, Bytes(kTap))),
                 "chunk of tap.0 while velocity was incomplete");
}

TEST(StepAssemblerTest, RefusesDuplicateOverlappingAndGappedChunks) {
  const std::string v = Bytes(kVelocity);
  {
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, v.substr(0, 8)));
    ExpectDataLoss(a.Add(Chunk("velocity", 0, v.substr(0, 8))),
                   "velocity: chunk at offset 0, expected 8");
  }
  {
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, v.substr(0, 8)));
    ExpectDataLoss(a.Add(Chunk("velocity", 4, v.substr(4, 8))),
                   "velocity: chunk at offset 4, expected 8");
  }
  {
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, v.substr(0, 8)));
    ExpectDataLoss(a.Add(Chunk("velocity", 16, v.substr(16))),
                   "velocity: chunk at offset 16, expected 8");
  }
  {  // A completed tensor's chunk again, while the next is being filled.
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, v));
    ExpectDataLoss(a.Add(Chunk("velocity", 0, v)), "chunk of velocity while tap.0 was incomplete");
  }
  {  // The last tensor's chunk again, once every tensor is complete.
    StepAssembler a;
    AddPending(a, Header({TensorHeaderOf("velocity", v1::FLOAT32, {2, 3}, 24)}));
    AddPending(a, Chunk("velocity", 0, v));
    ExpectDataLoss(a.Add(Chunk("velocity", 0, v)),
                   "velocity: a chunk after every tensor was complete");
  }
}

TEST(StepAssemblerTest, RefusesChunksBeyondTheAnnouncedSize) {
  StepAssembler a;
  AddPending(a, TwoTensorHeader());
  AddPending(a, Chunk("velocity", 0, std::string(20, 'x')));
  ExpectDataLoss(a.Add(Chunk("velocity", 20, std::string(5, 'x'))),
                 "velocity: chunks exceed the announced 24 bytes");
}

TEST(StepAssemblerTest, RefusesTrailerBeforeEveryByte) {
  {  // Part of a tensor.
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, Bytes(kVelocity).substr(0, 8)));
    ExpectDataLoss(a.Add(Trailer()), "velocity: got 8 of 24 bytes before the trailer");
  }
  {  // A whole tensor missing.
    StepAssembler a;
    AddPending(a, TwoTensorHeader());
    AddPending(a, Chunk("velocity", 0, Bytes(kVelocity)));
    ExpectDataLoss(a.Add(Trailer()), "tap.0: got 0 of 16 bytes before the trailer");
  }
}

// The messages given, as one StepAnswer: each header, chunk and trailer among them in its place.
v1::StepResponse Answer(const std::vector<v1::StepResponse>& parts) {
  v1::StepResponse m;
  v1::StepAnswer* a = m.mutable_answer();
  for (const v1::StepResponse& p : parts) {
    if (p.has_header()) *a->mutable_header() = p.header();
    if (p.has_chunk()) *a->add_chunks() = p.chunk();
    if (p.has_trailer()) *a->mutable_trailer() = p.trailer();
  }
  return m;
}

TEST(StepAssemblerTest, AWholeAnswerAssemblesAsItsStreamWould) {
  StepAssembler a;
  const std::string v = Bytes(kVelocity);
  absl::StatusOr<bool> done =
      a.Add(Answer({TwoTensorHeader(), Chunk("velocity", 0, v.substr(0, 8)),
                    Chunk("velocity", 8, v.substr(8)), Chunk("tap.0", 0, Bytes(kTap)), Trailer()}));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  StepReply reply = a.Take();
  EXPECT_EQ(reply.trailer.total_us(), 33);
  EXPECT_TRUE(torch::equal(reply.tensors.at("velocity"), torch::tensor(kVelocity).view({2, 3})));
  EXPECT_TRUE(torch::equal(reply.tensors.at("tap.0"), torch::tensor(kTap)));
}

// A whole answer is held to the stream's rules: header and trailer present, every announced byte,
// chunks in order, and nothing before or after it.
TEST(StepAssemblerTest, RefusesMalformedWholeAnswers) {
  const std::string v = Bytes(kVelocity), t = Bytes(kTap);
  const v1::StepResponse header = TwoTensorHeader(), trailer = Trailer();
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Answer({Chunk("velocity", 0, v), Chunk("tap.0", 0, t), trailer})),
                   "an answer without its header");
  }
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Answer({header, Chunk("velocity", 0, v), Chunk("tap.0", 0, t)})),
                   "an answer without its trailer");
  }
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Answer({header, Chunk("velocity", 0, v), trailer})),
                   "tap.0: got 0 of 16 bytes before the trailer");
  }
  {
    StepAssembler a;
    ExpectDataLoss(a.Add(Answer({header, Chunk("tap.0", 0, t), Chunk("velocity", 0, v), trailer})),
                   "chunk of tap.0 while velocity was incomplete");
  }
  {
    StepAssembler a;
    ExpectDataLoss(
        a.Add(Answer({header, Chunk("velocity", 0, v + "x"), Chunk("tap.0", 0, t), trailer})),
        "velocity: chunks exceed the announced 24 bytes");
  }
  {
    StepAssembler a;
    AddPending(a, header);
    ExpectDataLoss(a.Add(Answer({header, Chunk("velocity", 0, v), Chunk("tap.0", 0, t), trailer})),
                   "a second header");
  }
  {
    StepAssembler a;
    ASSERT_TRUE(*a.Add(Answer({Header({}), trailer})));
    ExpectDataLoss(a.Add(Trailer()), "message after the trailer");
  }
}

}  // namespace
}  // namespace praxis::client
