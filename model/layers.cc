#include "model/layers.h"

#include <cmath>
#include <numbers>

#include "model/cpu_kernels.h"

namespace praxis::model {

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return torch::linear(x.to(w.scalar_type()), w, b);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormWith(x, NormWeight(weight), eps);
}

torch::Tensor NormWeight(const torch::Tensor& weight, double scale) {
  return (1.0 + weight.to(torch::kFloat32)) * scale;
}

torch::Tensor RmsNormWith(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  if (!x.is_cuda()) return cpu::RmsNorm(x, w, eps);
  const torch::Tensor xf = x.to(torch::kFloat32);
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps) * w).to(x.scalar_type());
}

torch::Tensor Modulate(const torch::Tensor& x, const torch::Tensor& shift,
                       const torch::Tensor& scale, torch::ScalarType dtype) {
  return torch::addcmul(shift.to(dtype), x.to(dtype), scale.to(dtype)).to(x.scalar_type());
}

torch::Tensor FourierFeatures(const torch::Tensor& t, const torch::Tensor& freqs,
                              const torch::Tensor& phases) {
  const torch::Tensor tf = t.to(torch::kFloat32).unsqueeze(-1);
  return 0.5 * torch::cos(2.0 * std::numbers::pi * (tf * freqs + phases));
}

torch::Tensor VideoTokens(const torch::Tensor& x) {
  return x.permute({0, 2, 3, 4, 1}).reshape({x.size(0), -1, x.size(1)});
}

torch::Tensor Unpatch(const torch::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1) / (ph * pw), f = x.size(2), h = x.size(3),
                w = x.size(4);
  return x.reshape({b, c, ph, pw, f, h, w})
      .permute({0, 1, 4, 5, 2, 6, 3})
      .reshape({b, c, f, h * ph, w * pw});
}

torch::Tensor Patchify(const torch::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2), h = x.size(3) / ph, w = x.size(4) / pw;
  return x.reshape({b, c, f, h, ph, w, pw})
      .permute({0, 1, 4, 6, 2, 3, 5})
      .reshape({b, c * ph * pw, f, h, w});
}

torch::Tensor VideoPositions(int64_t frames, int64_t h, int64_t w, int64_t start) {
  const auto i64 = torch::kInt64;
  const torch::Tensor f = torch::arange(frames, i64).view({-1, 1, 1});
  const torch::Tensor r = torch::arange(h, i64).view({1, -1, 1});
  const torch::Tensor c = torch::arange(w, i64).view({1, 1, -1});
  return (start + f * kFrameStride + 1 + r * kRowStride + c).reshape({-1});
}

RopeTables MakeRopeTables(const torch::Tensor& positions, int64_t head_dim, double theta,
                          torch::Device device) {
  const torch::Tensor i = torch::arange(head_dim / 2, torch::kFloat64);
  const torch::Tensor inv_freq = torch::pow(theta, -2.0 * i / static_cast<double>(head_dim));
  const torch::Tensor angle = positions.to(torch::kFloat64).unsqueeze(1) * inv_freq.unsqueeze(0);
  const torch::Tensor cos = torch::cos(angle), sin = torch::sin(angle);
  return {torch::cat({cos, cos}, -1).to(device, torch::kFloat32),
          torch::cat({sin, sin}, -1).to(device, torch::kFloat32)};
}

torch::Tensor ApplyRope(const torch::Tensor& x, const RopeTables& rope) {
  const torch::Tensor xf = x.to(torch::kFloat32);
  const auto halves = xf.chunk(2, -1);
  const torch::Tensor rotated = torch::cat({-halves[1], halves[0]}, -1);
  const torch::Tensor cos = rope.cos.unsqueeze(0).unsqueeze(2);
  const torch::Tensor sin = rope.sin.unsqueeze(0).unsqueeze(2);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

torch::Tensor SwiGlu(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                     const torch::Tensor& down) {
  const torch::Tensor xd = x.to(a.scalar_type());
  return torch::linear(torch::silu(torch::linear(xd, a)) * torch::linear(xd, b), down);
}

namespace {

// One SwiGLU expert with fused [dim, 2·inner] gate_up weights (gate first, up second).
torch::Tensor FusedExpert(const torch::Tensor& x, const torch::Tensor& gate_up,
                          const torch::Tensor& down) {
  const auto gu = torch::matmul(x, gate_up).chunk(2, -1);
  return torch::matmul(torch::silu(gu[0]) * gu[1], down);
}

}  // namespace

torch::Tensor Moe(const torch::Tensor& x, const MoeWeights& w, int64_t top_k, double routed_scale) {
  const torch::ScalarType dt = w.gate_up.scalar_type();
  const torch::Tensor xs = x.reshape({-1, x.size(-1)}).to(dt);
  const torch::Tensor scores =
      torch::sigmoid(torch::matmul(xs.to(torch::kFloat32), w.router.to(torch::kFloat32).t()));
  const torch::Tensor chosen = std::get<1>(torch::topk(scores + w.expert_bias, top_k, -1));
  torch::Tensor weights = scores.gather(-1, chosen);
  weights = weights / weights.sum(-1, /*keepdim=*/true) * routed_scale;
  // Sort the (token, slot) pairs by expert so that each expert's tokens are one contiguous slice.
  const torch::Tensor flat_expert = chosen.flatten();
  const torch::Tensor order =
      std::get<1>(flat_expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const torch::Tensor tokens = torch::div(order, top_k, "floor");
  const torch::Tensor counts =
      torch::bincount(flat_expert, /*weights=*/{}, w.gate_up.size(0)).to(torch::kCPU);
  const torch::Tensor routed_x = xs.index_select(0, tokens);
  const torch::Tensor routed_w = weights.flatten().index_select(0, order).unsqueeze(1);
  torch::Tensor out = torch::zeros(xs.sizes(), xs.options().dtype(torch::kFloat32));
  const auto n = counts.accessor<int64_t, 1>();
  int64_t begin = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) {
    if (n[e] == 0) continue;
    const torch::Tensor y = FusedExpert(routed_x.narrow(0, begin, n[e]), w.gate_up[e], w.down[e]);
    out.index_add_(0, tokens.narrow(0, begin, n[e]),
                   routed_w.narrow(0, begin, n[e]) * y.to(torch::kFloat32));
    begin += n[e];
  }
  out = out + FusedExpert(xs, w.shared_gate_up, w.shared_down).to(torch::kFloat32);
  return out.to(dt).view(x.sizes());
}

}  // namespace praxis::model
