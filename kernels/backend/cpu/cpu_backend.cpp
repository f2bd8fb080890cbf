// kernels/backend/cpu/cpu_backend.cpp: CpuBackend. Checks shapes at the boundary, then calls kernels/cpu.
#include "kernels/backend/cpu/cpu_backend.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant/matmul.h"

namespace tessera {

namespace kc = kernels::cpu;

namespace {

void check_status(kc::Status status, const char* op, const Tensor& first) {
  TESSERA_CHECK(status == kc::Status::kOk,
                "cpu " << op << " on " << first.describe() << " failed: " << kc::status_name(status));
}

void check_cpu(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.defined(), "cpu " << op << ": an operand is undefined");
  TESSERA_CHECK(t.device() == DeviceKind::kCpu, "cpu " << op << ": " << t.describe() << " is not in host memory");
}

// Rows and columns of a 2-D tensor.
void check_matrix(const Tensor& t, const char* op, int64_t cols) {
  check_cpu(t, op);
  TESSERA_CHECK(t.shape().size() == 2 && t.dim(1) == cols,
                "cpu " << op << ": " << t.describe() << " must be [rows, " << cols << "]");
}

// The storage dtypes a weight matrix is kept in (the rest are converted to fp32 at load).
std::optional<ScalarType> kept_type(DType dtype) {
  switch (dtype) {
    case DType::kF16: return ScalarType::kF16;
    case DType::kBF16: return ScalarType::kBF16;
    case DType::kQ8_0: return ScalarType::kQ8_0;
    case DType::kQ4_0: return ScalarType::kQ4_0;
    case DType::kQ4_1: return ScalarType::kQ4_1;
    default: return std::nullopt;
  }
}

}  // namespace

void* BufferCache::take(size_t capacity) {
  if (capacity < kMinCached) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = free_.find(capacity);
  if (it == free_.end()) return nullptr;
  void* p = it->second;
  free_.erase(it);
  cached_bytes_ -= capacity;
  return p;
}

void BufferCache::give(void* p, size_t capacity) {
  if (capacity >= kMinCached) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_bytes_ + capacity <= kMaxCachedBytes) {
      free_.emplace(capacity, p);
      cached_bytes_ += capacity;
      return;
    }
  }
  release(p, capacity);
}

BufferCache::~BufferCache() { release_cached(); }

void BufferCache::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [capacity, p] : free_) release(p, capacity);
  free_.clear();
  cached_bytes_ = 0;
}

void* BufferCache::allocate(size_t capacity, bool* zeroed) {
  *zeroed = false;
  if (capacity < kMinMapped) return std::aligned_alloc(64, capacity);
  void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  *zeroed = true;
  return p;
}

void BufferCache::release(void* p, size_t capacity) {
  if (capacity < kMinMapped) {
    std::free(p);
  } else {
    munmap(p, capacity);
  }
}

size_t BufferCache::capacity_for(size_t bytes) {
  if (bytes < kMinCached) return bytes;
  size_t capacity = kMinCached;
  while (capacity < bytes) capacity *= 2;
  return capacity;
}

void CpuBackend::release_step_memory() {
  buffers_->release_cached();
  kc::release_activation_rows();  // the engine thread calls this, and it is the one that runs steps
  // Buffers under kMinMapped went back to malloc, in the arena of the thread that stepped; its free
  // pages stay resident until trimmed.
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

CpuBackend::CpuBackend(int num_threads) : CpuBackend(CpuBackendOptions{num_threads, true}) {}

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : options_(options), buffers_(std::make_shared<BufferCache>()) {
  TESSERA_CHECK(options.activation_bits == 8 || options.activation_bits == 16,
                "cpu backend: activation_bits must be 8 or 16, got " << options.activation_bits);
  kc::configure_threads(options.num_threads);
}

std::string CpuBackend::describe() const {
  std::string s = std::string(name()) + ": " + scalar_type_name(activation_type()) + ", kernels " +
                  kc::isa_name(kc::best_isa()) + ", " + std::to_string(options_.activation_bits) +
                  "-bit block activations";
  if (weight_formats_.empty()) return s;
  s += ", weights";
  const char* sep = " ";
  for (const auto& [format, use] : weight_formats_) {
    char line[96];
    std::snprintf(line, sizeof line, "%s%s x%lld (%.1f MiB)", sep, format.c_str(), static_cast<long long>(use.tensors),
                  static_cast<double>(use.bytes) / (1024.0 * 1024.0));
    s += line;
    sep = ", ";
  }
  return s;
}

namespace {
// "model.layers.12.mlp.gate_up" -> "model.layers.{L}.mlp.gate_up": a number between dots is a layer.
std::string group_of(const std::string& name) {
  std::string out;
  size_t i = 0;
  while (i < name.size()) {
    const bool at_segment = i == 0 || name[i - 1] == '.';
    size_t j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (at_segment && j > i && (j == name.size() || name[j] == '.')) {
      out += "{L}";
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}
}  // namespace

kc::WeightFormat CpuBackend::weight_format(const Tensor& w, const char* op) const {
  kc::WeightFormat format = kc::WeightFormat::kF32;
  switch (w.type()) {
    case ScalarType::kF32: return kc::WeightFormat::kF32;
    case ScalarType::kF16: return kc::WeightFormat::kF16;
    case ScalarType::kBF16: return kc::WeightFormat::kBF16;
    case ScalarType::kQ8_0: format = kc::WeightFormat::kQ8_0; break;
    case ScalarType::kQ4_0: format = kc::WeightFormat::kQ4_0; break;
    case ScalarType::kQ4_1: format = kc::WeightFormat::kQ4_1; break;
    case ScalarType::kI32:
    case ScalarType::kInt8PerRow:
    case ScalarType::kInt4G128:
    case ScalarType::kFp8E4M3PerRow:
    case ScalarType::kFp8E4M3:
      TESSERA_FAIL("cpu " << op << ": weight " << w.describe() << " is not a float or block format the CPU reads");
  }
  return interleaved_.count(w.data()) != 0 ? kc::interleaved_format(format) : format;
}

bool CpuBackend::interleaves(ScalarType type, int64_t rows) const {
  if (!options_.interleave_block_weights || rows % kc::kInterleaveRows != 0) return false;
  return type == ScalarType::kQ8_0 || type == ScalarType::kQ4_0 || type == ScalarType::kQ4_1;
}

void CpuBackend::copy_weight_rows(const Tensor& t, const std::byte* src, int64_t rows, std::byte* dst) {
  if (!interleaves(t.type(), rows)) {
    std::memcpy(dst, src, static_cast<size_t>(storage_bytes(t.type(), rows, t.dim(1))));
    return;
  }
  // Straight from the file's bytes into place: no second copy of the weights, not even for a moment.
  TESSERA_CHECK(kc::interleave_rows(kc::row_format(weight_format(t, "load")), src, rows, t.dim(1), dst),
                "cpu load: cannot interleave " << t.describe());
}

void CpuBackend::mark_layout(const Tensor& t, bool interleaved) {
  // Memory of a freed weight can come back as this one: a pointer left from it must not say
  // "interleaved" (weights load before serving starts, so this set is not written while linear reads).
  interleaved_.erase(t.data());
  if (interleaved) interleaved_.insert(t.data());
}

Tensor CpuBackend::record_weight(Tensor t) {
  const char* format = scalar_type_name(t.type());
  for (FormatUse* use : {&weight_formats_[format], &weight_groups_[{group_of(t.name()), format}]}) {
    ++use->tensors;
    use->bytes += t.bytes();
  }
  return t;
}

std::vector<CpuBackend::WeightGroup> CpuBackend::weight_groups() const {
  std::vector<WeightGroup> groups;
  for (const auto& [key, use] : weight_groups_) groups.push_back({key.first, key.second, use});
  return groups;
}

Tensor CpuBackend::empty(std::vector<int64_t> shape, ScalarType type, std::string name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TESSERA_CHECK(d >= 0, "cpu empty: tensor " << name << " has a negative dimension " << shape_string(shape));
    n *= d;
  }
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t storage_size = storage_bytes(type, cols == 0 ? 0 : n / cols, cols);
  // 64-byte alignment keeps vector loads aligned in the kernels.
  const size_t bytes = std::max<size_t>(64, (static_cast<size_t>(storage_size) + 63) / 64 * 64);
  const size_t capacity = BufferCache::capacity_for(bytes);
  bool zeroed = false;  // a reused buffer is dirty; a fresh map reads as zeros without being touched
  void* raw = buffers_->take(capacity);
  if (raw == nullptr) raw = BufferCache::allocate(capacity, &zeroed);
  TESSERA_CHECK(raw != nullptr, "cpu empty: out of memory allocating " << capacity << " bytes for " << name);
  if (!zeroed) std::memset(raw, 0, bytes);
  std::shared_ptr<void> storage(raw, [buffers = buffers_, capacity](void* p) { buffers->give(p, capacity); });
  return Tensor(storage, raw, type, std::move(shape), DeviceKind::kCpu, std::move(name));
}

Tensor CpuBackend::upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) {
  Tensor t = empty(std::move(shape), ScalarType::kF32, std::move(name));
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cpu upload: " << host.size() << " values for " << t.describe());
  std::copy(host.begin(), host.end(), t.f32());
  return t;
}

Tensor CpuBackend::upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) {
  Tensor t = empty(std::move(shape), ScalarType::kI32, std::move(name));
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cpu upload: " << host.size() << " values for " << t.describe());
  std::copy(host.begin(), host.end(), t.i32());
  return t;
}

std::vector<float> CpuBackend::download(const Tensor& tensor) {
  check_cpu(tensor, "download");
  const float* p = tensor.f32();
  return std::vector<float>(p, p + tensor.numel());
}

Tensor CpuBackend::load_weight(const WeightView& weight, std::vector<int64_t> shape, WeightUse /*use*/) {
  // Every matrix keeps its file format here (or all go to fp32), linear or not: `use` is for backends
  // that requantize linear weights.
  check_weight_shape(weight, shape);
  // Matrices keep their format; vectors (norms, biases) are tiny and read by fp32 kernels.
  const std::optional<ScalarType> kept =
      options_.keep_weight_formats && shape.size() == 2 ? kept_type(weight.dtype) : std::nullopt;
  if (!kept) return record_weight(upload(weight.to_f32(), std::move(shape), weight.name));
  Tensor t = empty(std::move(shape), *kept, weight.name);
  TESSERA_CHECK(weight.bytes.size() == static_cast<size_t>(t.bytes()),
                "weight " << weight.name << " in " << weight.source_file << ": " << weight.bytes.size()
                          << " bytes do not hold " << t.describe());
  mark_layout(t, false);  // weight_format below reads the row format
  copy_weight_rows(t, weight.bytes.data(), t.dim(0),
                   static_cast<std::byte*>(t.data()));
  mark_layout(t, interleaves(t.type(), t.dim(0)));
  return record_weight(std::move(t));
}

Tensor CpuBackend::load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                                std::string fused_name, WeightUse use) {
  TESSERA_CHECK(use != WeightUse::kGateUpSiluMul,
                "cpu: " << fused_name << " is for linear_silu_mul (fusions.gate_up: epilogue), which the cpu backend "
                                        "does not run");
  std::vector<int64_t> shape = stacked_shape(parts, shapes, fused_name);
  // Parts of one kept format stack as bytes (rows are whole blocks); mixed formats go to fp32.
  const std::optional<ScalarType> kept =
      options_.keep_weight_formats && shape.size() == 2 && !parts.empty() ? kept_type(parts.front()->dtype) : std::nullopt;
  const bool same_dtype = std::all_of(parts.begin(), parts.end(),
                                      [&](const WeightView* p) { return p->dtype == parts.front()->dtype; });
  if (kept.has_value() && same_dtype) {
    const ScalarType type = kept.value();
    Tensor fused = empty(std::move(shape), type, std::move(fused_name));
    mark_layout(fused, false);
    // Interleaved part by part: with every part a whole number of 8-row groups, no group straddles
    // two parts, so that equals interleaving the stacked matrix.
    const bool interleave = std::all_of(shapes.begin(), shapes.end(),
                                        [&](const std::vector<int64_t>& s) { return interleaves(type, s[0]); });
    auto* dst = static_cast<std::byte*>(fused.data());
    for (size_t i = 0; i < parts.size(); ++i) {
      const size_t want = static_cast<size_t>(storage_bytes(type, shapes[i][0], shapes[i][1]));
      TESSERA_CHECK(parts[i]->bytes.size() == want, "weight " << parts[i]->name << " in " << parts[i]->source_file
                                                               << ": " << parts[i]->bytes.size()
                                                               << " bytes do not hold " << shape_string(shapes[i])
                                                               << " " << scalar_type_name(type) << " values");
      const auto* src = parts[i]->bytes.data();
      if (interleave) {
        copy_weight_rows(fused, src, shapes[i][0], dst);
      } else {
        std::memcpy(dst, src, want);
      }
      dst += want;
    }
    mark_layout(fused, interleave);
    return record_weight(std::move(fused));
  }
  Tensor fused = empty(std::move(shape), ScalarType::kF32, std::move(fused_name));
  float* dst = fused.f32();
  for (const WeightView* part : parts) {
    const std::vector<float> values = part->to_f32();
    dst = std::copy(values.begin(), values.end(), dst);
  }
  return record_weight(std::move(fused));
}

KvCacheStorage CpuBackend::create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                           int32_t num_kv_heads, int32_t head_dim) {
  return make_kv_cache("cpu", num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                       [&](std::vector<int64_t> shape, std::string name) {
                         return empty(std::move(shape), ScalarType::kF32, std::move(name));
                       });
}

void CpuBackend::prepare_plan(AttentionPlan& /*plan*/) {}  // the kernels read the plan's host arrays

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out, bool accumulate) {
  check_cpu(ids, "embedding");
  check_cpu(table, "embedding");
  TESSERA_CHECK(table.shape().size() == 2, "cpu embedding: table " << table.describe() << " must be [vocab, dim]");
  check_matrix(out, "embedding", table.dim(1));
  TESSERA_CHECK(out.dim(0) == ids.numel(), "cpu embedding: " << out.describe() << " for " << ids.describe());
  if (table.type() == ScalarType::kF32) {
    check_status(kc::embedding_gather(ids.i32(), table.f32(), out.f32(), ids.numel(), table.dim(0), table.dim(1),
                                      accumulate),
                 "embedding (token id out of range?)", table);
    return;
  }
  // A table kept in its storage format (a tied lm_head shares it): rows are dequantized as gathered.
  check_status(kc::embedding_gather_rows(weight_format(table, "embedding"), ids.i32(), table.data(), out.f32(),
                                         ids.numel(), table.dim(0), table.dim(1), accumulate),
               "embedding (token id out of range?)", table);
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  check_cpu(w, "linear");
  TESSERA_CHECK(w.shape().size() == 2, "cpu linear: weight " << w.describe() << " must be [out, in]");
  check_matrix(x, "linear", w.dim(1));
  check_matrix(y, "linear", w.dim(0));
  TESSERA_CHECK(y.dim(0) == x.dim(0), "cpu linear: " << y.describe() << " for input " << x.describe());
  if (bias != nullptr) {
    check_cpu(*bias, "linear");
    TESSERA_CHECK(bias->numel() == w.dim(0), "cpu linear: bias " << bias->describe() << " for " << w.describe());
  }
  if (x.dim(0) == 0) return;
  // The one dispatch on the weight's storage format (kernels/cpu/quant/matmul.h).
  check_status(kc::linear(weight_format(w, "linear"), w.data(), x.f32(), bias ? bias->f32() : nullptr, y.f32(),
                          x.dim(0), w.dim(0), w.dim(1), static_cast<kc::ActivationBits>(options_.activation_bits)),
               "linear", w);
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_matrix(x, "rms_norm", w.numel());
  check_matrix(out, "rms_norm", w.numel());
  TESSERA_CHECK(out.dim(0) == x.dim(0), "cpu rms_norm: " << out.describe() << " for " << x.describe());
  check_status(kc::rms_norm(x.f32(), w.f32(), out.f32(), x.dim(0), x.dim(1), eps), "rms_norm", x);
}

void CpuBackend::add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  check_matrix(x, "add_rms_norm", w.numel());
  check_matrix(residual, "add_rms_norm", w.numel());
  TESSERA_CHECK(residual.dim(0) == x.dim(0), "cpu add_rms_norm: " << residual.describe() << " for " << x.describe());
  check_status(kc::add_rms_norm(x.f32(), residual.f32(), w.f32(), x.dim(0), x.dim(1), eps), "add_rms_norm", x);
}

void CpuBackend::layer_norm(Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& b, float eps) {
  check_matrix(x, "layer_norm", w.numel());
  TESSERA_CHECK(b.numel() == w.numel(), "cpu layer_norm: bias " << b.describe() << " for " << w.describe());
  if (residual != nullptr) {
    check_matrix(*residual, "layer_norm", w.numel());
    TESSERA_CHECK(residual->dim(0) == x.dim(0), "cpu layer_norm: " << residual->describe() << " for " << x.describe());
  }
  check_status(kc::layer_norm(x.f32(), residual ? residual->f32() : nullptr, w.f32(), b.f32(), x.dim(0), x.dim(1), eps),
               "layer_norm", x);
}

void CpuBackend::copy_kv_rows(KvCacheStorage& cache, std::span<const int32_t> src_slots,
                              std::span<const int32_t> dst_slots, std::span<const int32_t> rotate_by,
                              const Tensor& inv_freq) {
  TESSERA_CHECK(src_slots.size() == dst_slots.size() && src_slots.size() == rotate_by.size(),
                "cpu copy_kv_rows: " << src_slots.size() << " sources, " << dst_slots.size() << " destinations, "
                                     << rotate_by.size() << " rotations");
  TESSERA_CHECK(inv_freq.numel() == cache.head_dim / 2,
                "cpu copy_kv_rows: " << inv_freq.describe() << " for head_dim " << cache.head_dim);
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (size_t r = 0; r < src_slots.size(); ++r) {
    TESSERA_CHECK(src_slots[r] >= 0 && src_slots[r] < num_slots && dst_slots[r] >= 0 && dst_slots[r] < num_slots,
                  "cpu copy_kv_rows: slot " << src_slots[r] << " -> " << dst_slots[r] << " outside " << num_slots);
  }
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    check_status(kc::kv_copy_rotate(cache.k[l].f32(), cache.v[l].f32(), src_slots.data(), dst_slots.data(),
                                    rotate_by.data(), static_cast<int64_t>(src_slots.size()), cache.num_kv_heads,
                                    cache.head_dim, inv_freq.f32()),
                 "copy_kv_rows", cache.k[l]);
  }
}

void CpuBackend::rope(Tensor& qkv, const QkvLayout& layout, const Tensor& inv_freq, const AttentionPlan& plan) {
  check_matrix(qkv, "rope", layout.row_width());
  TESSERA_CHECK(qkv.dim(0) == plan.total_q(), "cpu rope: " << qkv.describe() << " for a plan of " << plan.total_q() << " tokens");
  TESSERA_CHECK(inv_freq.numel() == layout.head_dim / 2, "cpu rope: " << inv_freq.describe() << " for head_dim " << layout.head_dim);
  float* base = qkv.f32();
  const int64_t stride = layout.row_width();
  check_status(kc::rope_rotate_half(base + layout.q_offset(), stride, plan.positions().data(), inv_freq.f32(),
                                    qkv.dim(0), layout.num_heads, layout.head_dim),
               "rope (q)", qkv);
  check_status(kc::rope_rotate_half(base + layout.k_offset(), stride, plan.positions().data(), inv_freq.f32(),
                                    qkv.dim(0), layout.num_kv_heads, layout.head_dim),
               "rope (k)", qkv);
}

void CpuBackend::attention(const Tensor& qkv, const QkvLayout& layout, float scale, const AttentionPlan& plan,
                           KvCacheStorage* cache, int64_t layer, Tensor& out) {
  check_matrix(qkv, "attention", layout.row_width());
  check_matrix(out, "attention", static_cast<int64_t>(layout.num_heads) * layout.head_dim);
  TESSERA_CHECK(qkv.dim(0) == plan.total_q() && out.dim(0) == plan.total_q(),
                "cpu attention: " << qkv.describe() << " -> " << out.describe() << " for a plan of "
                                  << plan.total_q() << " tokens");
  const float* base = qkv.f32();
  const int64_t stride = layout.row_width();
  kc::PackedQueries queries;
  queries.q = base + layout.q_offset();
  queries.q_row_stride = stride;
  queries.cu_seqlens_q = plan.cu_seqlens_q().data();
  queries.num_seqs = plan.num_seqs();
  queries.masks = plan.masks().data();
  const kc::AttentionDims dims{layout.num_heads, layout.num_kv_heads, layout.head_dim, scale};
  if (!plan.paged()) {
    TESSERA_CHECK(cache == nullptr, "cpu attention: a KV cache was given but the plan has none");
    check_status(kc::attention_varlen(queries, base + layout.k_offset(), stride, base + layout.v_offset(), stride,
                                      plan.cu_seqlens_k().data(), dims, out.f32()),
                 "attention", qkv);
    return;
  }
  TESSERA_CHECK(cache != nullptr, "cpu attention: the plan is paged but no KV cache was given");
  TESSERA_CHECK(layer >= 0 && layer < cache->num_layers(), "cpu attention: layer " << layer << " of a "
                                                                                   << cache->num_layers() << "-layer cache");
  TESSERA_CHECK(cache->block_size == plan.block_size() && cache->num_kv_heads == layout.num_kv_heads &&
                    cache->head_dim == layout.head_dim,
                "cpu attention: cache (block_size " << cache->block_size << ", kv heads " << cache->num_kv_heads
                                                    << ", head_dim " << cache->head_dim << ") does not match the plan/layout");
  Tensor& k_cache = cache->k[layer];
  Tensor& v_cache = cache->v[layer];
  check_status(kc::kv_cache_write(base + layout.k_offset(), stride, base + layout.v_offset(), stride,
                                  plan.slot_mapping().data(), plan.total_q(), layout.num_kv_heads, layout.head_dim,
                                  k_cache.f32(), v_cache.f32(),
                                  static_cast<int64_t>(cache->num_blocks) * cache->block_size),
               "kv_cache_write", k_cache);
  kc::PagedKv kv;
  kv.k_cache = k_cache.f32();
  kv.v_cache = v_cache.f32();
  kv.num_blocks = cache->num_blocks;
  kv.block_size = cache->block_size;
  kv.block_tables = plan.block_tables().data();
  kv.max_blocks_per_seq = plan.max_blocks_per_seq();
  kv.context_lens = plan.kv_lens().data();
  check_status(kc::attention_paged(queries, kv, dims, out.f32()), "attention (paged)", qkv);
}

void CpuBackend::add(const Tensor& x, Tensor& residual) {
  check_cpu(x, "add");
  check_cpu(residual, "add");
  TESSERA_CHECK(x.shape() == residual.shape(), "cpu add: " << x.describe() << " and " << residual.describe()
                                                            << " differ in shape");
  const float* src = x.f32();
  float* dst = residual.f32();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void CpuBackend::concat_columns(std::span<const Tensor* const> parts, Tensor& out) {
  TESSERA_CHECK(!parts.empty(), "cpu concat_columns: no parts for " << out.describe());
  check_cpu(out, "concat_columns");
  TESSERA_CHECK(out.shape().size() == 2, "cpu concat_columns: " << out.describe() << " must be [rows, cols]");
  const int64_t rows = out.dim(0);
  int64_t cols = 0;
  for (const Tensor* part : parts) {
    check_matrix(*part, "concat_columns", part->shape().size() == 2 ? part->dim(1) : -1);
    TESSERA_CHECK(part->dim(0) == rows, "cpu concat_columns: " << part->describe() << " has not the "
                                                              << rows << " rows of " << out.describe());
    cols += part->dim(1);
  }
  TESSERA_CHECK(cols == out.dim(1), "cpu concat_columns: parts have " << cols << " columns, " << out.describe());
  float* dst = out.f32();
  for (int64_t r = 0; r < rows; ++r) {
    for (const Tensor* part : parts) {
      const int64_t c = part->dim(1);
      std::memcpy(dst, part->f32() + r * c, static_cast<size_t>(c) * sizeof(float));
      dst += c;
    }
  }
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  check_cpu(out, "silu_mul");
  TESSERA_CHECK(out.shape().size() == 2, "cpu silu_mul: " << out.describe() << " must be [rows, dim]");
  check_matrix(gate_up, "silu_mul", 2 * out.dim(1));
  TESSERA_CHECK(gate_up.dim(0) == out.dim(0), "cpu silu_mul: " << out.describe() << " for " << gate_up.describe());
  check_status(kc::silu_mul(gate_up.f32(), out.f32(), out.dim(0), out.dim(1)), "silu_mul", gate_up);
}

void CpuBackend::gelu(Tensor& x) {
  check_cpu(x, "gelu");
  check_status(kc::gelu_erf(x.f32(), x.numel()), "gelu", x);
}

void CpuBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  check_cpu(x, "gather_rows");
  TESSERA_CHECK(x.shape().size() == 2, "cpu gather_rows: " << x.describe() << " must be [rows, dim]");
  check_matrix(out, "gather_rows", x.dim(1));
  TESSERA_CHECK(out.dim(0) == static_cast<int64_t>(rows.size()),
                "cpu gather_rows: " << out.describe() << " for " << rows.size() << " rows");
  const int64_t dim = x.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    TESSERA_CHECK(rows[i] >= 0 && rows[i] < x.dim(0), "cpu gather_rows: row " << rows[i] << " of " << x.describe());
    std::memcpy(out.f32() + i * dim, x.f32() + rows[i] * dim, sizeof(float) * dim);
  }
}

void CpuBackend::pool(const Tensor& x, const AttentionPlan& plan, PoolMode mode, Tensor& out) {
  check_cpu(x, "pool");
  TESSERA_CHECK(x.shape().size() == 2 && x.dim(0) == plan.total_q(),
                "cpu pool: " << x.describe() << " for a plan of " << plan.total_q() << " tokens");
  check_matrix(out, "pool", x.dim(1));
  TESSERA_CHECK(out.dim(0) == plan.num_seqs(), "cpu pool: " << out.describe() << " for " << plan.num_seqs() << " sequences");
  check_status(kc::pool_sequences(x.f32(), plan.cu_seqlens_q().data(), out.f32(), plan.num_seqs(), x.dim(1),
                                  mode == PoolMode::kMean ? kc::PoolKind::kMean : kc::PoolKind::kFirst),
               "pool", x);
}

void CpuBackend::l2_normalize(Tensor& x) {
  check_cpu(x, "l2_normalize");
  TESSERA_CHECK(x.shape().size() == 2, "cpu l2_normalize: " << x.describe() << " must be [rows, dim]");
  check_status(kc::l2_normalize(x.f32(), x.dim(0), x.dim(1)), "l2_normalize", x);
}

void CpuBackend::softmax(Tensor& x) {
  check_cpu(x, "softmax");
  TESSERA_CHECK(x.shape().size() == 2, "cpu softmax: " << x.describe() << " must be [rows, dim]");
  check_status(kc::softmax(x.f32(), x.dim(0), x.dim(1)), "softmax", x);
}

void CpuBackend::join_group(std::shared_ptr<HostCollective> group, int32_t rank) {
  TESSERA_CHECK(group != nullptr && rank >= 0 && rank < group->size(),
                "cpu backend: rank " << rank << " of a tensor-parallel group of " << (group ? group->size() : 0));
  group_ = std::move(group);
  rank_ = rank;
}

void CpuBackend::all_reduce(Tensor& x) {
  if (!group_) return Backend::all_reduce(x);
  check_cpu(x, "all_reduce");
  group_->all_reduce(rank_, x.f32(), x.numel());
}

void CpuBackend::all_gather(const Tensor& part, Tensor& whole) {
  if (!group_) return Backend::all_gather(part, whole);
  check_cpu(part, "all_gather");
  check_cpu(whole, "all_gather");
  check_all_gather(part, whole, group_->size());
  group_->all_gather(rank_, part.f32(), whole.f32(), part.numel());
}

std::string CpuBackend::failure() const {
  if (group_ && group_->aborted()) return "a rank of the tensor-parallel group failed, so the group was aborted";
  return {};
}

void CpuBackend::abort_collectives() {
  if (group_) group_->abort();
}

}  // namespace tessera
