// tests/gpu/test_gemm.cpp: the cuBLASLt wrapper y = x · Wᵀ (+ bias) against a CPU reference, with odd
// shapes, bias on and off, and plan reuse across calls; and the small-m GEMV path (m <= 8) that run()
// dispatches to, with awkward n and k, an odd y offset, the cuBLASLt fallback and CUDA-graph capture.
#include <cstddef>
#include <utility>
#include <vector>

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

// m <= 8 goes through the GEMV kernel: n not a multiple of its rows per block (1, 37, 4099), k with a
// partial last step (8, 72, 4104, 11008) or none (4096), bias on and off, y at an odd element offset
// for odd n (y and bias need no vector alignment). k = 13 (not a multiple of 8) falls back to cuBLASLt.
TEST(Gemm, SmallMGemvPath) {
  TESSERA_REQUIRE_GPU();
  kernels::cuda::GemmRunner gemm;
  CUDA_OK(gemm.init());
  const std::vector<std::pair<int, int>> shapes = {{1, 8},     {1, 4096},    {37, 8},      {37, 72},
                                                   {37, 11008}, {4099, 4104}, {300, 4096}, {37, 13}};
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int m : {1, 2, 3, 5, 8}) {
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
              << name(dtype) << " m" << m << " n" << n << " k" << k << " bias " << with_bias;
        }
      }
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
