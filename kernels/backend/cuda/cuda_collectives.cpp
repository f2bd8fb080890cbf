// kernels/backend/cuda/cuda_collectives.cpp: the CUDA backend's tensor-parallel group: one NCCL
// communicator per rank, made together in this process; the all-reduce the graphs call after
// their row-split projections, and the all-gather of logits split by vocabulary.
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "kernels/backend/cuda/cuda_backend_impl.h"

namespace tessera {

namespace {

ncclDataType_t nccl_type(ScalarType type) {
  switch (type) {
    case ScalarType::kBF16: return ncclBfloat16;
    case ScalarType::kF16: return ncclFloat16;
    case ScalarType::kF32: return ncclFloat32;
    default: TESSERA_FAIL("cuda collectives: " << scalar_type_name(type) << " tensors are not sent between ranks");
  }
}

// NCCL's error, and why it happened when the group was aborted (another rank failed).
std::string nccl_error(ncclResult_t r, bool aborted, const char* group_aborted) {
  return std::string(ncclGetErrorString(r)) + (aborted ? std::string(" (") + group_aborted + ")" : std::string());
}

}  // namespace

void CudaBackend::form_group(std::span<CudaBackend* const> ranks) {
  TESSERA_CHECK(ranks.size() >= 2, "cuda: a tensor-parallel group needs at least 2 ranks, got " << ranks.size());
  std::vector<int> devices;
  std::ostringstream names;
  for (CudaBackend* rank : ranks) {
    const int device = rank->impl_->config.device;
    TESSERA_CHECK(rank->impl_->nccl.load() == nullptr, "cuda: device " << device << " already belongs to a group");
    for (int d : devices) TESSERA_CHECK(d != device, "cuda: device " << device << " appears twice in one group");
    names << (devices.empty() ? "" : ", ") << device;
    devices.push_back(device);
  }
  std::vector<ncclComm_t> comms(ranks.size(), nullptr);
  const ncclResult_t r = ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
  TESSERA_CHECK(r == ncclSuccess, "cuda: NCCL could not join devices " << names.str() << " into one tensor-parallel group: "
                                                                        << ncclGetErrorString(r));
  std::string why = "not asked for (oneshot_allreduce is off)";
  const bool wanted =
      std::all_of(ranks.begin(), ranks.end(), [](CudaBackend* r) { return r->impl_->config.oneshot_allreduce; });
  std::shared_ptr<kc::OneShotGroup> oneshot = wanted ? kc::OneShotGroup::create(devices, &why) : nullptr;
  if (!oneshot) spdlog::warn("tensor parallel: no one-shot all-reduce over NVLink ({}); NCCL does every all-reduce", why);
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i]->impl_->oneshot = oneshot;
    ranks[i]->impl_->nccl = comms[i];
    ranks[i]->impl_->group_size = static_cast<int32_t>(ranks.size());
    ranks[i]->impl_->group_rank = static_cast<int32_t>(i);
  }
}

int32_t CudaBackend::tensor_parallel_size() const { return impl_->group_size; }
int32_t CudaBackend::tensor_parallel_rank() const { return impl_->group_rank; }

void CudaBackend::all_reduce(Tensor& x) {
  Impl& gpu = *impl_;
  if (gpu.group_size == 1) return Backend::all_reduce(x);
  cuda_backend_detail::check_device(x, "all_reduce");
  ncclComm* const comm = gpu.nccl.load();
  TESSERA_CHECK(comm != nullptr, "cuda all_reduce: " << Impl::kGroupAborted);
  const ncclResult_t r =
      ncclAllReduce(x.data(), x.data(), static_cast<size_t>(x.numel()), nccl_type(x.type()), ncclSum, comm, gpu.stream);
  TESSERA_CHECK(r == ncclSuccess, "cuda all_reduce of " << x.describe() << ": "
                                                        << nccl_error(r, gpu.collectives_aborted, Impl::kGroupAborted));
}

void CudaBackend::all_gather(const Tensor& part, Tensor& whole) {
  Impl& gpu = *impl_;
  if (gpu.group_size == 1) return Backend::all_gather(part, whole);
  cuda_backend_detail::check_device(part, "all_gather");
  cuda_backend_detail::check_device(whole, "all_gather");
  check_all_gather(part, whole, gpu.group_size);
  ncclComm* const comm = gpu.nccl.load();
  TESSERA_CHECK(comm != nullptr, "cuda all_gather: " << Impl::kGroupAborted);
  const ncclResult_t r = ncclAllGather(part.data(), whole.data(), static_cast<size_t>(part.numel()),
                                       nccl_type(part.type()), comm, gpu.stream);
  TESSERA_CHECK(r == ncclSuccess, "cuda all_gather of " << part.describe() << ": "
                                                        << nccl_error(r, gpu.collectives_aborted, Impl::kGroupAborted));
}

void CudaBackend::all_reduce_add_rms_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps) {
  Impl& gpu = *impl_;
  const bool fits = gpu.oneshot != nullptr && x.shape().size() == 2 && x.type() == gpu.config.dtype &&
                    residual.shape() == x.shape() && w.numel() == x.dim(1) &&
                    kc::oneshot_fits(static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), x.data(), residual.data(),
                                     w.data());
  if (!fits || gpu.collectives_aborted) return Backend::all_reduce_add_rms_norm(x, residual, w, eps);
  cuda_backend_detail::check_device(x, "all_reduce_add_rms_norm");
  gpu.check(kc::oneshot_allreduce_add_rmsnorm(gpu.kdtype, gpu.oneshot->rank(gpu.group_rank), x.data(), residual.data(),
                                              w.data(), static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), eps,
                                              gpu.stream),
            "all_reduce_add_rms_norm", x);
}

void CudaBackend::abort_collectives() {
  Impl& gpu = *impl_;
  if (gpu.oneshot) gpu.oneshot->abort();
  ncclComm* const comm = gpu.nccl.exchange(nullptr);
  if (comm == nullptr) return;
  // The kernels of the group's collectives stop waiting for the other ranks; what they computed is
  // lost, so the backend is failed from here on, as after a sticky CUDA error.
  gpu.collectives_aborted = true;
  ncclCommAbort(comm);
}

void CudaBackend::Impl::leave_group() {
  if (ncclComm* const comm = nccl.exchange(nullptr)) ncclCommDestroy(comm);
}

}  // namespace tessera
