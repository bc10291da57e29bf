// libFuzzer target for the request path's decoder and validator: praxis::serve::DecodeStepRequest
// against the embedded tiny model config, with the serving limits' defaults.
//
// The first input byte picks how the rest becomes a praxis.v1.StepRequest:
//   even  the rest is a serialized StepRequest, parsed as gRPC would parse it (any bytes at all);
//   odd   the rest drives a builder that makes a request of a valid layout (small B, L, K, F, h, w,
//         dtypes and values) and then applies a few hostile edits (a shape dimension, a dtype, the
//         data length, a rope shift, frames_per_chunk, tap indices, the wire dtype, a dropped
//         tensor), and may leave text out for a Session's kept text of its own rows and length
//         (which a session keeps only after validating it). Raw proto mutation alone rarely gets
//         past the first byte-count check; the builder reaches ValidateStep and the limit checks
//         on nearly every run.
// Whatever comes in, DecodeStepRequest must return: a crash, a sanitizer report, an uncaught
// exception (LibTorch's included) or an error other than InvalidArgument is a finding. A request it
// accepts must also be what the model can run (checked below), so "accepted but wrong" is one too.

#include <fuzzer/FuzzedDataProvider.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model_loader.h"
#include "praxis/v1/praxis.pb.h"
#include "server/step_request.h"

namespace praxis::serve {
namespace {

const model::BackboneConfig& Config() {
  static const model::BackboneConfig* config = [] {
    absl::StatusOr<model::BackboneConfig> c = model::ParseConfig(model::kEmbeddedTinyConfig);
    if (!c.ok()) {
      std::fprintf(stderr, "embedded tiny config: %s\n", c.status().ToString().c_str());
      std::abort();
    }
    return new model::BackboneConfig(*std::move(c));
  }();
  return *config;
}

// A crash with a message: libFuzzer saves the input that led here.
void Fail(const std::string& what) {
  std::fprintf(stderr, "step_request_fuzzer: %s\n", what.c_str());
  std::abort();
}

constexpr v1::DType kFloatDtypes[] = {v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16};

int ElementBytes(v1::DType d) { return d == v1::FLOAT32 ? 4 : d == v1::INT64 ? 8 : 2; }

// A float tensor of `shape`: zeros, a small in-range value (bit patterns that are finite for every
// float dtype), or raw fuzzer bytes (NaN, inf, huge values included).
v1::Tensor MakeTensor(FuzzedDataProvider& p, const std::vector<int64_t>& shape) {
  v1::Tensor t;
  const v1::DType dtype = p.PickValueInArray(kFloatDtypes);
  t.set_dtype(dtype);
  int64_t numel = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    numel *= d;
  }
  const size_t bytes = static_cast<size_t>(numel) * ElementBytes(dtype);
  std::string data(bytes, '\0');
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      break;
    case 1:  // 0x3e: the high byte of 0.125-ish in float16/bfloat16/float32 alike
      for (size_t i = 1; i < bytes; i += 2) data[i] = 0x3e;
      break;
    default: {
      const std::string raw = p.ConsumeBytesAsString(bytes);
      data.replace(0, raw.size(), raw);
    }
  }
  t.set_data(std::move(data));
  return t;
}

// A request of a valid layout for the tiny config (clean present iff K > 1).
v1::StepRequest BuildValid(FuzzedDataProvider& p, const model::BackboneConfig& c) {
  const int64_t b = p.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t k = p.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t f = p.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t h = p.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t w = p.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t ah = p.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t aw = p.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t len = p.ConsumeIntegralInRange<int64_t>(1, 6);
  const int64_t ch = c.latent_channels();
  v1::StepRequest r;
  *r.mutable_text() = MakeTensor(p, {b, len, c.text_dim});
  *r.mutable_anchor() = MakeTensor(p, {b, ch, 1, ah, aw});
  if (k > 1) *r.mutable_clean() = MakeTensor(p, {b, ch, (k - 1) * f, h, w});
  *r.mutable_noised() = MakeTensor(p, {b, ch, k * f, h, w});
  *r.mutable_timesteps() = MakeTensor(p, {b, k});
  r.set_frames_per_chunk(f);
  r.set_decode(!p.ConsumeBool());
  v1::OutputSelection* o = r.mutable_outputs();
  o->set_velocity(r.decode() && !p.ConsumeBool());
  o->set_all_taps(!p.ConsumeBool());
  o->set_cond(p.ConsumeBool());
  o->set_embeddings(p.ConsumeBool());
  o->set_positions(p.ConsumeBool());
  return r;
}

// A size from the ones that break arithmetic (overflow at 2^31, 2^32, 2^62, 2^63; zero; negative)
// or any int64: the interesting ones are too rare among 2^64 for the fuzzer to hit by chance.
int64_t PickSize(FuzzedDataProvider& p) {
  constexpr int64_t kInteresting[] = {0,
                                      -1,
                                      1,
                                      (int64_t{1} << 31),
                                      int64_t{1} << 32,
                                      int64_t{1} << 40,
                                      int64_t{1} << 61,
                                      int64_t{1} << 62,
                                      INT64_MAX,
                                      INT64_MIN};
  return p.ConsumeBool() ? p.PickValueInArray(kInteresting) : p.ConsumeIntegral<int64_t>();
}

v1::Tensor* PickTensor(FuzzedDataProvider& p, v1::StepRequest& r) {
  switch (p.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return r.mutable_text();
    case 1:
      return r.mutable_anchor();
    case 2:
      return r.mutable_clean();
    case 3:
      return r.mutable_noised();
    default:
      return r.mutable_timesteps();
  }
}

// One hostile edit of `r`.
void Edit(FuzzedDataProvider& p, v1::StepRequest& r) {
  switch (p.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: {  // a dimension to any value (huge, negative, zero)
      v1::Tensor* t = PickTensor(p, r);
      if (t->shape_size() > 0) {
        t->set_shape(p.ConsumeIntegralInRange<int>(0, t->shape_size() - 1), PickSize(p));
      }
      break;
    }
    case 1:  // a dimension added
      PickTensor(p, r)->add_shape(PickSize(p));
      break;
    case 2:  // any dtype, known or not
      PickTensor(p, r)->set_dtype(static_cast<v1::DType>(p.ConsumeIntegral<int32_t>()));
      break;
    case 3:  // data cut or grown
      PickTensor(p, r)->mutable_data()->resize(p.ConsumeIntegralInRange<size_t>(0, 1 << 16));
      break;
    case 4:  // a tensor dropped
      PickTensor(p, r)->Clear();
      break;
    case 5:
      r.set_frames_per_chunk(PickSize(p));
      break;
    case 6: {  // rope shifts: 0..5 values of any size
      r.clear_rope_shifts();
      const int n = p.ConsumeIntegralInRange<int>(0, 5);
      for (int i = 0; i < n; ++i) r.add_rope_shifts(PickSize(p));
      break;
    }
    case 7: {  // tap indices, mostly near the valid ones so that repeats are common
      r.mutable_outputs()->set_all_taps(p.ConsumeBool());
      const int n = p.ConsumeIntegralInRange<int>(0, 8);
      for (int i = 0; i < n; ++i) {
        r.mutable_outputs()->add_taps(p.ConsumeBool() ? p.ConsumeIntegralInRange<int32_t>(-1, 3)
                                                      : p.ConsumeIntegral<int32_t>());
      }
      break;
    }
    case 8:
      r.set_wire_dtype(static_cast<v1::DType>(p.ConsumeIntegral<int32_t>()));
      break;
    default:
      r.set_decode(p.ConsumeBool());
      r.mutable_outputs()->set_velocity(p.ConsumeBool());
      break;
  }
}

// What an accepted request promises the model: the shapes ValidateStep documents.
void CheckAccepted(const DecodedStep& s, const model::BackboneConfig& c) {
  const model::StepInputs& in = s.inputs;
  if (in.noised.dim() != 5 || in.noised.size(1) != c.latent_channels()) Fail("noised shape");
  const int64_t b = in.noised.size(0), kf = in.noised.size(2);
  if (in.frames_per_chunk < 1 || kf % in.frames_per_chunk != 0) Fail("frames_per_chunk");
  const int64_t k = kf / in.frames_per_chunk;
  if (in.timesteps.dim() != 2 || in.timesteps.size(0) != b || in.timesteps.size(1) != k) {
    Fail("timesteps shape");
  }
  if (in.text.dim() != 3 || in.text.size(0) != b || in.text.size(2) != c.text_dim) {
    Fail("text shape");
  }
  if (in.anchor.dim() != 5 || in.anchor.size(0) != b) Fail("anchor shape");
  if ((k > 1) != in.clean.defined()) Fail("clean present iff K > 1");
  // SPEC section 12: duplicate output selections are refused (each copy costs a whole tensor).
  const int n_taps = static_cast<int>(c.encoder.tap_blocks.size());
  std::vector<bool> seen(n_taps, false);
  for (int t : s.outputs.taps) {
    if (t < 0 || t >= n_taps) Fail("tap index out of range");
    if (seen[t]) Fail("a tap index accepted twice");
    seen[t] = true;
  }
  if (s.outputs.velocity && !in.decode) Fail("velocity without decode");
}

// One input: a request made from `data`, decoded; see the file comment for what fails.
void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const model::BackboneConfig& config = Config();
  v1::StepRequest request;
  torch::Tensor kept_text;
  if (data[0] % 2 == 0) {
    if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return;
  } else {
    FuzzedDataProvider p(data + 1, size - 1);
    request = BuildValid(p, config);
    const int edits = p.ConsumeIntegralInRange<int>(0, 3);
    for (int i = 0; i < edits; ++i) Edit(p, request);
    if (p.ConsumeBool()) {  // a Session's kept text, possibly of other rows than this request's
      constexpr torch::ScalarType kDtypes[] = {torch::kFloat32, torch::kBFloat16, torch::kHalf};
      kept_text = torch::full({p.ConsumeIntegralInRange<int64_t>(1, 3),
                               p.ConsumeIntegralInRange<int64_t>(1, 6), config.text_dim},
                              0.125, torch::dtype(p.PickValueInArray(kDtypes)));
      if (p.ConsumeBool()) request.clear_text();
    }
  }
  absl::StatusOr<DecodedStep> step = DecodeStepRequest(request, config, {}, kept_text);
  if (step.ok()) {
    CheckAccepted(*step, config);
  } else if (step.status().code() != absl::StatusCode::kInvalidArgument &&
             step.status().code() != absl::StatusCode::kResourceExhausted) {
    // INVALID_ARGUMENT for a malformed request; RESOURCE_EXHAUSTED for a valid one over its
    // compute cost or answer size.
    Fail("refused with a code other than INVALID_ARGUMENT or RESOURCE_EXHAUSTED: " +
         step.status().ToString());
  }
}

}  // namespace
}  // namespace praxis::serve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  praxis::serve::FuzzOne(data, size);
  return 0;
}
