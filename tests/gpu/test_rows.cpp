// tests/gpu/test_rows.cpp: the row ops (gather, pooling, L2 normalisation, softmax, fp32
// conversion) against CPU references on odd widths (scalar paths) and multiples of 8 (vector paths),
// with empty sequences, negative row indices and a zero row.
#include <algorithm>
#include <limits>

#include "gpu_test_util.h"
#include "kernels/cuda/rows/rows.h"

namespace tessera::gpu_test {
namespace {

using kernels::cuda::PoolKind;

const DType kDtypes[] = {DType::kBF16, DType::kFP16};

TEST(Rows, GatherWithNegativeRowsZeroed) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (int width : {111, 769, 1024}) {
      std::mt19937 rng(width);
      const int src_rows = 23;
      HostTensor x = HostTensor::random(dtype, static_cast<size_t>(src_rows) * width, rng);
      const std::vector<int32_t> rows{22, 0, -1, 5, 5, 13, 7};
      DeviceBuffer d_x, d_rows, d_out(rows.size() * width * 2 + 16);
      upload(d_x, x.bits);
      upload(d_rows, rows);
      poison(d_out);
      CUDA_OK(kernels::cuda::gather_rows(dtype, d_out.get(), d_x.get(), d_rows.as<int32_t>(),
                                         static_cast<int>(rows.size()), width, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> out = download<uint16_t>(d_out, rows.size() * width);
      for (size_t i = 0; i < rows.size(); ++i)
        for (int c = 0; c < width; ++c) {
          const uint16_t want = rows[i] >= 0 ? x.bits[static_cast<size_t>(rows[i]) * width + c] : uint16_t{0};
          ASSERT_EQ(out[i * width + c], want) << name(dtype) << " width " << width << " row " << i << " col " << c;
        }
    }
  }
}

TEST(Rows, PoolMeanFirstLastWithEmptySequences) {
  TESSERA_REQUIRE_GPU();
  const std::vector<int32_t> cu{0, 5, 5, 6, 19, 52, 52, 1077};  // lengths 5, 0, 1, 13, 33, 0, 1025
  const int num_seqs = static_cast<int>(cu.size()) - 1;
  for (DType dtype : kDtypes) {
    for (int width : {111, 769, 4096}) {
      for (PoolKind kind : {PoolKind::kMean, PoolKind::kFirst, PoolKind::kLast}) {
        std::mt19937 rng(width + static_cast<int>(kind));
        // Offset from zero, so a mean that lost rows or mis-divided shows.
        HostTensor x = HostTensor::random(dtype, static_cast<size_t>(cu.back()) * width, rng, -1.f, 3.f);
        std::vector<float> ref(static_cast<size_t>(num_seqs) * width, 0.f);
        for (int s = 0; s < num_seqs; ++s) {
          const int n = cu[s + 1] - cu[s];
          if (n == 0) continue;
          for (int c = 0; c < width; ++c) {
            double v = 0;
            if (kind == PoolKind::kFirst) {
              v = x.values[static_cast<size_t>(cu[s]) * width + c];
            } else if (kind == PoolKind::kLast) {
              v = x.values[static_cast<size_t>(cu[s + 1] - 1) * width + c];
            } else {
              for (int r = cu[s]; r < cu[s + 1]; ++r) v += x.values[static_cast<size_t>(r) * width + c];
              v /= n;
            }
            ref[static_cast<size_t>(s) * width + c] = static_cast<float>(v);
          }
        }
        DeviceBuffer d_x, d_cu, d_out(ref.size() * 2 + 16);
        upload(d_x, x.bits);
        upload(d_cu, cu);
        poison(d_out);
        CUDA_OK(kernels::cuda::pool_rows(dtype, d_out.get(), d_x.get(), d_cu.as<int32_t>(), num_seqs, width, kind,
                                         nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> bits = download<uint16_t>(d_out, ref.size());
        for (int s = 0; s < num_seqs; ++s) {
          const std::vector<float> out = to_floats(
              std::vector<uint16_t>(bits.begin() + s * width, bits.begin() + (s + 1) * width), dtype);
          const std::vector<float> want(ref.begin() + s * width, ref.begin() + (s + 1) * width);
          if (cu[s + 1] == cu[s] || kind != PoolKind::kMean) {
            for (int c = 0; c < width; ++c)
              ASSERT_EQ(out[c], want[c]) << name(dtype) << " width " << width << " kind " << static_cast<int>(kind)
                                         << " seq " << s << " col " << c;
          } else {
            EXPECT_LE(normalized_error(out, want), tolerance(dtype) / 2)
                << name(dtype) << " width " << width << " seq " << s;
          }
        }
      }
    }
  }
}

// The engine pools a text packed among others or alone (one text a request): the same bits either way.
TEST(Rows, PoolMeanGivesATextTheSameBitsPackedOrAlone) {
  TESSERA_REQUIRE_GPU();
  const std::vector<int32_t> packed_cu{0, 7, 40, 169};  // the text of 129 rows starts at row 40
  const int width = 769, begin = 40, rows = 129;
  for (DType dtype : kDtypes) {
    std::mt19937 rng(5);
    HostTensor x = HostTensor::random(dtype, static_cast<size_t>(packed_cu.back()) * width, rng, -1.f, 3.f);
    const std::vector<uint16_t> alone_bits(x.bits.begin() + static_cast<ptrdiff_t>(begin) * width,
                                           x.bits.begin() + static_cast<ptrdiff_t>(begin + rows) * width);
    std::vector<uint16_t> packed, alone;
    auto pool = [&](const std::vector<uint16_t>& bits, const std::vector<int32_t>& cu, std::vector<uint16_t>& out) {
      const int num_seqs = static_cast<int>(cu.size()) - 1;
      DeviceBuffer d_x, d_cu, d_out(static_cast<size_t>(num_seqs) * width * 2 + 16);
      upload(d_x, bits);
      upload(d_cu, cu);
      CUDA_OK(kernels::cuda::pool_rows(dtype, d_out.get(), d_x.get(), d_cu.as<int32_t>(), num_seqs, width,
                                       PoolKind::kMean, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      out = download<uint16_t>(d_out, static_cast<size_t>(num_seqs) * width);
    };
    pool(x.bits, packed_cu, packed);
    pool(alone_bits, {0, rows}, alone);
    ASSERT_EQ(packed.size(), 3u * width);
    ASSERT_EQ(alone.size(), static_cast<size_t>(width));
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), packed.begin() + 2 * width)) << name(dtype);
  }
}

TEST(Rows, L2NormalizeWithZeroRow) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (int width : {111, 769, 4096}) {
      std::mt19937 rng(width);
      const int rows = 9;
      HostTensor x = HostTensor::random(dtype, static_cast<size_t>(rows) * width, rng, -2.f, 2.f);
      for (int c = 0; c < width; ++c) x.set(static_cast<size_t>(4) * width + c, 0.f);  // a zero row stays zero
      std::vector<float> ref(x.size());
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = 0; c < width; ++c) ss += static_cast<double>(x.values[r * width + c]) * x.values[r * width + c];
        const double denom = std::max(std::sqrt(ss), 1e-12);
        for (int c = 0; c < width; ++c) ref[r * width + c] = static_cast<float>(x.values[r * width + c] / denom);
      }
      DeviceBuffer d_x;
      upload(d_x, x.bits);
      CUDA_OK(kernels::cuda::l2_normalize_rows(dtype, d_x.get(), rows, width, 1e-12f, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> out = to_floats(download<uint16_t>(d_x, x.size()), dtype);
      for (int r = 0; r < rows; ++r) {
        const std::vector<float> o(out.begin() + r * width, out.begin() + (r + 1) * width);
        const std::vector<float> w(ref.begin() + r * width, ref.begin() + (r + 1) * width);
        if (r == 4) {
          for (int c = 0; c < width; ++c) ASSERT_EQ(o[c], 0.f) << name(dtype) << " zero row col " << c;
        } else {
          EXPECT_LE(normalized_error(o, w), tolerance(dtype) / 2) << name(dtype) << " width " << width << " row " << r;
        }
      }
    }
  }
}

TEST(Rows, Softmax) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (int width : {1, 7, 111, 769, 32003}) {
      std::mt19937 rng(width);
      const int rows = 5;
      HostTensor x = HostTensor::random(dtype, static_cast<size_t>(rows) * width, rng, -8.f, 8.f);
      std::vector<float> ref(x.size());
      for (int r = 0; r < rows; ++r) {
        const float* row = &x.values[static_cast<size_t>(r) * width];
        const double mx = *std::max_element(row, row + width);
        double sum = 0;
        for (int c = 0; c < width; ++c) sum += std::exp(row[c] - mx);
        for (int c = 0; c < width; ++c) ref[static_cast<size_t>(r) * width + c] = static_cast<float>(std::exp(row[c] - mx) / sum);
      }
      DeviceBuffer d_x;
      upload(d_x, x.bits);
      CUDA_OK(kernels::cuda::softmax_rows(dtype, d_x.get(), rows, width, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_x, x.size()), dtype), ref), tolerance(dtype) / 2)
          << name(dtype) << " width " << width;
    }
  }
}

TEST(Rows, ConvertToAndFromF32) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    std::mt19937 rng(static_cast<int>(dtype));
    const int64_t n = 100003;  // odd: no grid or vector multiple
    HostTensor x = HostTensor::random(dtype, n, rng, -100.f, 100.f);
    DeviceBuffer d_x, d_f(n * sizeof(float) + 16);
    upload(d_x, x.bits);
    CUDA_OK(kernels::cuda::convert_to_f32(dtype, d_f.as<float>(), d_x.get(), n, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> f = download<float>(d_f, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], x.values[i]) << name(dtype) << " to_f32 " << i;

    // Back: random floats, exact halfway cases (ties to even), values past the dtype's range.
    std::vector<float> src(n);
    std::uniform_real_distribution<float> dist(-1000.f, 1000.f);
    for (auto& v : src) v = dist(rng);
    src[0] = 0.f;
    src[1] = -0.f;
    src[2] = std::numeric_limits<float>::infinity();
    src[3] = 1e30f;   // inf in fp16, finite in bf16
    src[4] = 1.f + (dtype == DType::kBF16 ? 1.f / 256 : 1.f / 2048);      // halfway: rounds down to 1
    src[5] = 1.f + 3 * (dtype == DType::kBF16 ? 1.f / 256 : 1.f / 2048);  // halfway: rounds up
    src[6] = 1e-30f;  // underflow
    DeviceBuffer d_src, d_out(n * 2 + 16);
    upload(d_src, src);
    poison(d_out);
    CUDA_OK(kernels::cuda::convert_from_f32(dtype, d_out.get(), d_src.as<float>(), n, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = download<uint16_t>(d_out, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], to_bits(src[i], dtype)) << name(dtype) << " from_f32 " << i;
    EXPECT_EQ(from_bits(out[4], dtype), 1.f);
  }
}

TEST(Rows, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::rows_unsupported(DType::kBF16, 3, 0).find("width"), std::string::npos);
  EXPECT_NE(kernels::cuda::rows_unsupported(DType::kBF16, -1, 8).find("rows"), std::string::npos);
  EXPECT_NE(kernels::cuda::pool_rows_unsupported(DType::kFP16, 2, 8, static_cast<PoolKind>(9)).find("pool kind"),
            std::string::npos);
  EXPECT_NE(kernels::cuda::convert_unsupported(static_cast<DType>(5), 4).find("dtype"), std::string::npos);
  EXPECT_EQ(kernels::cuda::rows_unsupported(DType::kFP16, 0, 1), "");
}

}  // namespace
}  // namespace tessera::gpu_test
