// libFuzzer target for the model config parser: model::ParseConfig on any text, as a config.json
// from an untrusted checkpoint could hold.
//
// Beyond not crashing (SIGFPE, signed overflow, an uncaught nlohmann or LibTorch exception), a
// config it accepts must be one the rest of the server can size itself from without dividing by
// zero or overflowing: the derived values the model and the server compute are evaluated here
// with checked arithmetic.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/config.h"

namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "config_fuzzer: %s\n", what.c_str());
  std::abort();
}

// a * b, or Fail when it leaves int64.
int64_t Mul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) Fail(std::string("overflow: ") + what);
  return out;
}

void CheckAccepted(const praxis::model::BackboneConfig& c) {
  if (c.dim <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0) Fail("non-positive width");
  if (c.dim % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0) Fail("heads do not divide");
  if (c.decoder.unpatch_factor.size() != 3) Fail("unpatch_factor is not (t, ph, pw)");
  if (c.ph() <= 0 || c.pw() <= 0) Fail("non-positive patch factor");
  // What a decoder frame of the largest grid the server admits (128 x 128, StepLimits) costs.
  Mul(Mul(Mul(128, c.ph(), "h * ph"), Mul(128, c.pw(), "w * pw"), "decoder grid"),
      c.decoder.video_out_c_out, "decoder frame elements");
  Mul(c.dim, c.encoder.ffn_dim, "encoder ffn weights");
  Mul(c.dim, c.decoder.ffn_dim, "decoder ffn weights");
  for (const auto* tower : {&c.encoder, &c.decoder}) {
    for (int64_t b : tower->moe_blocks) {
      if (b < 0 || b >= tower->depth) Fail("moe block outside the tower");
    }
  }
  for (int64_t b : c.encoder.tap_blocks) {
    if (b < 0 || b >= c.encoder.depth) Fail("tap block outside the encoder");
  }
  (void)c.param_dtype();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<praxis::model::BackboneConfig> config = praxis::model::ParseConfig(text);
  if (config.ok()) {
    CheckAccepted(*config);
  } else if (config.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail("refused with a code other than INVALID_ARGUMENT: " + config.status().ToString());
  }
  return 0;
}
