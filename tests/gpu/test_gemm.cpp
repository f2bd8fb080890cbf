// tests/gpu/test_gemm.cpp: the cuBLASLt wrapper y = x · Wᵀ (+ bias) against a CPU reference, with odd
// shapes, bias on and off, and plan reuse across calls.
#include "gpu_test_util.h"
#include "kernels/cuda/gemm/gemm.h"

namespace tessera::gpu_test {
namespace {

TEST(Gemm, RowMajorXWTransposedWithBias) {
  TESSERA_REQUIRE_GPU();
  kernels::cuda::GemmRunner gemm;
  CUDA_OK(gemm.init());
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (auto [m, n, k] : {std::tuple{37, 200, 96}, std::tuple{1, 576, 576}, std::tuple{128, 1536, 384}}) {
      for (bool with_bias : {true, false}) {
        std::mt19937 rng(m + n + k);
        HostTensor x = HostTensor::random(dtype, static_cast<size_t>(m) * k, rng);
        HostTensor w = HostTensor::random(dtype, static_cast<size_t>(n) * k, rng);
        HostTensor b = HostTensor::random(dtype, n, rng);
        std::vector<float> ref(static_cast<size_t>(m) * n);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            double acc = with_bias ? b.values[j] : 0.0;
            for (int e = 0; e < k; ++e)
              acc += static_cast<double>(x.values[static_cast<size_t>(i) * k + e]) * w.values[static_cast<size_t>(j) * k + e];
            ref[static_cast<size_t>(i) * n + j] = static_cast<float>(acc);
          }
        DeviceBuffer d_x, d_w, d_b, d_y(ref.size() * 2 + 16);
        upload(d_x, x.bits);
        upload(d_w, w.bits);
        upload(d_b, b.bits);
        for (int call = 0; call < 2; ++call) {  // second call runs from the cached plan
          poison(d_y);
          ASSERT_EQ(gemm.run(dtype, d_y.get(), d_x.get(), d_w.get(), with_bias ? d_b.get() : nullptr, m, n, k, nullptr),
                    cudaSuccess)
              << gemm.last_error();
          CUDA_OK(cudaDeviceSynchronize());
          EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_y, ref.size()), dtype), ref), tolerance(dtype) / 2)
              << name(dtype) << " m" << m << " n" << n << " k" << k << " bias " << with_bias;
        }
      }
    }
  }
}

TEST(Gemm, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::gemm_unsupported(4, 0, 8).find("n=0"), std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
