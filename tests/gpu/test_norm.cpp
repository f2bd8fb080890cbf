// tests/gpu/test_norm.cpp: fused add+RMSNorm, plain RMSNorm and LayerNorm against CPU references, on
// awkward hidden sizes (vector and scalar paths), strided rows and misaligned pointers.
#include "gpu_test_util.h"
#include "kernels/cuda/norm/norm.h"

namespace tessera::gpu_test {
namespace {

struct NormCase {
  DType dtype;
  int tokens;
  int hidden;
  int64_t x_stride;     // >= hidden
  int pointer_offset;   // elements; 1 makes every pointer 2 bytes off 16-byte alignment
};

class FusedAddRmsNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(FusedAddRmsNorm, MatchesReference) {
  TESSERA_REQUIRE_GPU();
  const NormCase c = GetParam();
  std::mt19937 rng(c.hidden * 31 + c.tokens);
  const size_t x_elems = static_cast<size_t>(c.tokens) * c.x_stride, r_elems = static_cast<size_t>(c.tokens) * c.hidden;
  HostTensor x = HostTensor::random(c.dtype, x_elems, rng, -2.f, 2.f);
  HostTensor res = HostTensor::random(c.dtype, r_elems, rng, -2.f, 2.f);
  HostTensor w = HostTensor::random(c.dtype, c.hidden, rng, 0.5f, 1.5f);
  const float eps = 1e-6f;

  // Reference first (the kernel is in place): residual <- round(x + residual); x <- rmsnorm(residual) * w.
  std::vector<float> ref_res(r_elems), ref_x(r_elems);
  for (int t = 0; t < c.tokens; ++t) {
    double ss = 0;
    for (int i = 0; i < c.hidden; ++i) {
      const float sum = round_to(x.values[t * c.x_stride + i] + res.values[static_cast<size_t>(t) * c.hidden + i], c.dtype);
      ref_res[static_cast<size_t>(t) * c.hidden + i] = sum;
      ss += static_cast<double>(sum) * sum;
    }
    const double inv = 1.0 / std::sqrt(ss / c.hidden + eps);
    for (int i = 0; i < c.hidden; ++i)
      ref_x[static_cast<size_t>(t) * c.hidden + i] =
          static_cast<float>(ref_res[static_cast<size_t>(t) * c.hidden + i] * inv * w.values[i]);
  }

  const int off = c.pointer_offset;
  DeviceBuffer d_x((x_elems + off) * 2 + 16), d_res((r_elems + off) * 2 + 16), d_w((c.hidden + off) * 2 + 16);
  uint16_t* px = d_x.as<uint16_t>() + off;
  uint16_t* pr = d_res.as<uint16_t>() + off;
  uint16_t* pw = d_w.as<uint16_t>() + off;
  CUDA_OK(cudaMemcpy(px, x.bits.data(), x_elems * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pr, res.bits.data(), r_elems * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pw, w.bits.data(), c.hidden * 2, cudaMemcpyHostToDevice));
  CUDA_OK(kernels::cuda::fused_add_rmsnorm(c.dtype, px, pr, pw, c.tokens, c.hidden, c.x_stride, eps, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> out_x(x_elems), out_r(r_elems);
  CUDA_OK(cudaMemcpy(out_x.data(), px, x_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out_r.data(), pr, r_elems * 2, cudaMemcpyDeviceToHost));
  std::vector<float> got_x(r_elems);
  for (int t = 0; t < c.tokens; ++t) {
    for (int i = 0; i < c.hidden; ++i)
      got_x[static_cast<size_t>(t) * c.hidden + i] = from_bits(out_x[t * c.x_stride + i], c.dtype);
    for (int64_t i = c.hidden; i < c.x_stride; ++i)  // the padding between rows is untouched
      ASSERT_EQ(out_x[t * c.x_stride + i], x.bits[t * c.x_stride + i]) << "row padding overwritten";
  }
  EXPECT_LE(normalized_error(to_floats(out_r, c.dtype), ref_res), 1e-6) << "residual";
  EXPECT_LE(normalized_error(got_x, ref_x), tolerance(c.dtype) / 2) << "normalised x";

  // Plain RMSNorm of the new residual into a separate output (the first layer's form).
  DeviceBuffer d_out(r_elems * 2 + 16);
  CUDA_OK(kernels::cuda::rmsnorm(c.dtype, d_out.get(), pr, pw, c.tokens, c.hidden, c.hidden, c.hidden, eps, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_out, r_elems), c.dtype), ref_x), tolerance(c.dtype) / 2)
      << "plain rmsnorm";
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardSizes, FusedAddRmsNorm,
    ::testing::Values(NormCase{DType::kBF16, 3, 111, 111, 0}, NormCase{DType::kFP16, 5, 769, 769, 0},
                      NormCase{DType::kBF16, 2, 5125, 5125, 0}, NormCase{DType::kBF16, 17, 4096, 4096, 0},
                      NormCase{DType::kFP16, 1, 4096, 4096, 0}, NormCase{DType::kBF16, 4, 8, 8, 0},
                      NormCase{DType::kBF16, 3, 768, 776, 0},    // strided rows, vector path
                      NormCase{DType::kFP16, 3, 768, 771, 0},    // odd stride: scalar path
                      NormCase{DType::kBF16, 2, 4096, 4096, 1},  // misaligned: scalar path
                      NormCase{DType::kBF16, 2, 40960, 40960, 0},  // beyond the register path
                      NormCase{DType::kFP16, 64, 8192, 8192, 0}));

TEST(LayerNorm, WithAndWithoutResidual) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    // 384, 768, 1024: one warp a row, one to four vectors a lane; 769 and 4096: one block a row.
    for (int hidden : {384, 768, 769, 1024, 4096}) {
      for (bool with_res : {false, true}) {
        std::mt19937 rng(hidden + with_res);
        const int tokens = 9;  // not a whole number of the warp kernel's blocks
        const size_t n = static_cast<size_t>(tokens) * hidden;
        HostTensor x = HostTensor::random(dtype, n, rng, -3.f, 3.f), r = HostTensor::random(dtype, n, rng);
        HostTensor g = HostTensor::random(dtype, hidden, rng, 0.5f, 1.5f), b = HostTensor::random(dtype, hidden, rng);
        std::vector<float> ref(n);
        for (int t = 0; t < tokens; ++t) {
          std::vector<double> vals(hidden);
          double mean = 0, var = 0;
          for (int i = 0; i < hidden; ++i) {
            float v = x.values[static_cast<size_t>(t) * hidden + i];
            if (with_res) v = round_to(v + r.values[static_cast<size_t>(t) * hidden + i], dtype);
            vals[i] = v;
            mean += v;
          }
          mean /= hidden;
          for (double v : vals) var += (v - mean) * (v - mean);
          var /= hidden;
          for (int i = 0; i < hidden; ++i)
            ref[static_cast<size_t>(t) * hidden + i] =
                static_cast<float>((vals[i] - mean) / std::sqrt(var + 1e-12) * g.values[i] + b.values[i]);
        }
        DeviceBuffer d_x, d_r, d_g, d_b;
        upload(d_x, x.bits);
        upload(d_r, r.bits);
        upload(d_g, g.bits);
        upload(d_b, b.bits);
        CUDA_OK(kernels::cuda::layernorm(dtype, d_x.get(), d_x.get(), with_res ? d_r.get() : nullptr, d_g.get(),
                                         d_b.get(), tokens, hidden, 1e-12f, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_x, n), dtype), ref), tolerance(dtype) / 2)
            << name(dtype) << " hidden " << hidden << " residual " << with_res;
      }
    }
  }
}

TEST(Norm, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::norm_unsupported(4, 0, 0, 0).find("hidden"), std::string::npos);
  EXPECT_NE(kernels::cuda::norm_unsupported(4, 128, 100, 128).find("x_stride"), std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
