// tests/gpu/test_gemm.cpp: the cuBLASLt wrapper y = x · Wᵀ (+ bias) against a CPU reference, with odd
// shapes, bias on and off, and plan reuse across calls; and the small-m GEMV path (m <= 8) that run()
// dispatches to, with awkward n and k, an odd y offset, the cuBLASLt fallback, CUDA-graph capture, and
// rows that are the same bits at any m when asked.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemv.h"

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

// y = x · wᵀ in fp64 over the rounded inputs, without bias (added per case).
std::vector<double> reference_xwt(const HostTensor& x, const HostTensor& w, int m, int n, int k) {
  std::vector<double> ref(static_cast<size_t>(m) * n);
  for (int j = 0; j < n; ++j) {
    const float* w_row = &w.values[static_cast<size_t>(j) * k];
    for (int i = 0; i < m; ++i) {
      const float* x_row = &x.values[static_cast<size_t>(i) * k];
      double acc = 0.0;
      for (int e = 0; e < k; ++e) acc += static_cast<double>(x_row[e]) * w_row[e];
      ref[static_cast<size_t>(i) * n + j] = acc;
    }
  }
  return ref;
}

// m <= 8 goes through the GEMV kernels: n not a multiple of their rows per block (1, 37, 4099), k
// with a partial last step (8, 72, 4104, 11008) or none (4096), bias on and off, y at an odd element
// offset for odd n (y and bias need no vector alignment). k = 13 (not a multiple of 8) falls back to
// cuBLASLt. m = 1 and 8 run twice: as fastest (m = 8 on the tensor-core kernel) and asked for the
// same bits at any m (both on the row-streaming kernel).
TEST(Gemm, SmallMGemvPath) {
  TESSERA_REQUIRE_GPU();
  kernels::cuda::GemmRunner gemm;
  CUDA_OK(gemm.init());
  const std::vector<std::pair<int, int>> shapes = {{1, 8},     {1, 4096},    {37, 8},      {37, 72},
                                                   {37, 11008}, {4099, 4104}, {300, 4096}, {37, 13}};
  using kernels::cuda::GemvRowBits;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (auto [m, row_bits] : {std::pair{1, GemvRowBits::kFastest}, std::pair{1, GemvRowBits::kSameAtAnyM},
                               std::pair{2, GemvRowBits::kFastest}, std::pair{3, GemvRowBits::kFastest},
                               std::pair{5, GemvRowBits::kFastest}, std::pair{8, GemvRowBits::kFastest},
                               std::pair{8, GemvRowBits::kSameAtAnyM}}) {
      gemm.set_gemv_row_bits(row_bits);
      for (auto [n, k] : shapes) {
        std::mt19937 rng(1000 * m + n + k);
        HostTensor x = HostTensor::random(dtype, static_cast<size_t>(m) * k, rng);
        HostTensor w = HostTensor::random(dtype, static_cast<size_t>(n) * k, rng);
        HostTensor b = HostTensor::random(dtype, n, rng);
        const std::vector<double> xwt = reference_xwt(x, w, m, n, k);
        DeviceBuffer d_x, d_w, d_b, d_y(xwt.size() * 2 + 16);
        upload(d_x, x.bits);
        upload(d_w, w.bits);
        upload(d_b, b.bits);
        const size_t y_offset = n % 2;  // elements
        for (bool with_bias : {true, false}) {
          std::vector<float> ref(xwt.size());
          for (size_t i = 0; i < ref.size(); ++i)
            ref[i] = static_cast<float>(xwt[i] + (with_bias ? b.values[i % n] : 0.0));
          poison(d_y);
          uint16_t* y = d_y.as<uint16_t>() + y_offset;
          ASSERT_EQ(gemm.run(dtype, y, d_x.get(), d_w.get(), with_bias ? d_b.get() : nullptr, m, n, k, nullptr),
                    cudaSuccess)
              << gemm.last_error();
          CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> out = download<uint16_t>(d_y, ref.size() + y_offset);
          out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(y_offset));
          EXPECT_LE(normalized_error(to_floats(out, dtype), ref), tolerance(dtype) / 2)
              << name(dtype) << " m" << m << " n" << n << " k" << k << " bias " << with_bias << " same bits at any m "
              << (row_bits == GemvRowBits::kSameAtAnyM);
        }
      }
    }
  }
}

// Asked for the same bits at any m, a row of x gets the same output bits alone as among up to 8 rows,
// and those are the bits the fastest setting gives it alone (what a speculative verify needs of its
// rows: the tokens a server without speculation decodes), from both the plain GEMV and the SiLU·mul
// epilogue.
TEST(Gemm, GemvRowsAreTheSameBitsAtAnyMWhenAsked) {
  TESSERA_REQUIRE_GPU();
  namespace kc = kernels::cuda;
  const DType dtype = DType::kBF16;
  for (auto [n, k] : {std::pair{4098, 11008}, std::pair{38, 72}}) {
    std::mt19937 rng(n + k);
    HostTensor x = HostTensor::random(dtype, static_cast<size_t>(kc::kGemvMaxM) * k, rng);
    HostTensor w = HostTensor::random(dtype, static_cast<size_t>(n) * k, rng);
    DeviceBuffer d_x, d_w, d_y(static_cast<size_t>(kc::kGemvMaxM) * n * 2);
    upload(d_x, x.bits);
    upload(d_w, w.bits);
    for (bool silu_mul : {false, true}) {
      const int cols = silu_mul ? n / 2 : n;
      auto rows_of = [&](int m, kc::GemvRowBits bits = kc::GemvRowBits::kSameAtAnyM) -> std::vector<uint16_t> {
        poison(d_y);
        const cudaError_t status =
            silu_mul ? kc::gemv_silu_mul(dtype, d_y.get(), d_x.get(), d_w.get(), m, n, k, bits, nullptr)
                     : kc::gemv(dtype, d_y.get(), d_x.get(), d_w.get(), nullptr, m, n, k, bits, nullptr);
        EXPECT_EQ(status, cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return download<uint16_t>(d_y, static_cast<size_t>(m) * cols);
      };
      const std::vector<uint16_t> all = rows_of(kc::kGemvMaxM);
      for (int m : {1, 3, 5}) {
        const std::vector<uint16_t> some = rows_of(m);
        EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()))
            << "n" << n << " k" << k << " silu_mul " << silu_mul << ": the first " << m << " rows differ from a batch of 8";
      }
      const std::vector<uint16_t> alone = rows_of(1, kc::GemvRowBits::kFastest);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin()))
          << "n" << n << " k" << k << " silu_mul " << silu_mul << ": a row alone, fastest, differs from its bits in 8";
    }
  }
}

// The GEMV path is capturable in a CUDA graph (no allocation, no sync) and replays correctly.
TEST(Gemm, SmallMGemvCapturesInGraph) {
  TESSERA_REQUIRE_GPU();
  kernels::cuda::GemmRunner gemm;
  CUDA_OK(gemm.init());
  const DType dtype = DType::kBF16;
  const int m = 2, n = 301, k = 1032;
  std::mt19937 rng(7);
  HostTensor x = HostTensor::random(dtype, static_cast<size_t>(m) * k, rng);
  HostTensor w = HostTensor::random(dtype, static_cast<size_t>(n) * k, rng);
  HostTensor b = HostTensor::random(dtype, n, rng);
  const std::vector<double> xwt = reference_xwt(x, w, m, n, k);
  std::vector<float> ref(xwt.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<float>(xwt[i] + b.values[i % n]);
  DeviceBuffer d_x, d_w, d_b, d_y(ref.size() * 2 + 16);
  upload(d_x, x.bits);
  upload(d_w, w.bits);
  upload(d_b, b.bits);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t run_err = gemm.run(dtype, d_y.get(), d_x.get(), d_w.get(), d_b.get(), m, n, k, stream);
  const cudaError_t end_err = cudaStreamEndCapture(stream, &graph);
  EXPECT_EQ(run_err, cudaSuccess) << gemm.last_error();
  EXPECT_EQ(end_err, cudaSuccess);
  if (run_err == cudaSuccess && end_err == cudaSuccess) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2 && exec != nullptr; ++replay) {
      poison(d_y);
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_y, ref.size()), dtype), ref), tolerance(dtype) / 2)
          << "replay " << replay;
    }
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(Gemm, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::gemm_unsupported(4, 0, 8).find("n=0"), std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
