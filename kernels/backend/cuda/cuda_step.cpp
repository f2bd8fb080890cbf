// kernels/backend/cuda/cuda_step.cpp: CudaBackend's per-step state and CUDA graphs: prepare_step
// uploads the step's attention metadata and resets the step workspace; run_step runs a decode step,
// or an encoder's forward of one sequence, eagerly the first time its shape is seen, captures it the
// second, and replays the graph after.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_attention_plan.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"

namespace tessera {

void CudaBackend::Impl::layout_moved() {
  if (!graphs.empty()) ++regrowths;
  ++layout_generation;
}

void CudaBackend::Impl::drop_graphs() {
  for (auto& [key, graph] : graphs) cudaGraphExecDestroy(graph.exec);
  graphs.clear();
  warmed.clear();
}

void CudaBackend::prepare_plan(AttentionPlan& plan) { prepare_step(plan, {}); }

Tensor CudaBackend::prepare_step(AttentionPlan& plan, std::span<const int32_t> token_ids) {
  Impl& gpu = *impl_;
  gpu.enter();
  TESSERA_CHECK(
      token_ids.empty() || static_cast<int64_t>(token_ids.size()) == plan.total_q(),
      "cuda prepare_step: " << token_ids.size() << " token ids for a plan of " << plan.total_q() << " tokens");
  gpu.reset_workspace();
  gpu.in_step = true;

  auto step = std::make_shared<Impl::StepState>();
  const cuda_backend_detail::AttentionMetadata metadata(plan, token_ids, *step);
  gpu.reserve_staging(metadata.bytes());
  char* host = static_cast<char*>(gpu.staging_host);
  char* device = static_cast<char*>(gpu.staging_device);
  metadata.write(host, device);
  gpu.check(cudaMemcpyAsync(device, host, metadata.bytes(), cudaMemcpyHostToDevice, gpu.stream), "plan upload");
  gpu.check(cudaEventRecord(gpu.staging_copied, gpu.stream), "staging");
  int32_t* device_token_ids = metadata.bind(*step, device);

  // An encoder's forward of one text is a hundred small launches that the host issues slower than the
  // GPU runs them; keyed by the text's length, it replays like a decode step. Packed batches of
  // several texts are too varied to repeat a shape, and larger, so they run eagerly.
  if (!plan.paged() && plan.num_seqs() == 1) step->encoder_tokens = static_cast<int32_t>(plan.total_q());
  step->graph_eligible =
      gpu.config.cuda_graphs && ((plan.paged() && step->max_q_len == 1) || step->encoder_tokens > 0);
  // A captured decode step plans its split for the bucket's longest context, so that every step
  // replaying it is covered; an eager step plans for the real one.
  step->decode_context = step->graph_eligible ? step->table_width * plan.block_size() : step->max_kv_len;
  // A verify's rows read at most every row's key of the step: bounding them by the row count keeps
  // one graph per shape whatever the draft lengths.
  step->step_keys = plan.step_keys_read() > 1 ? std::max(step->decode_rows, 2) : 1;
  step->one_request = plan.one_request();
  gpu.current_step = step;
  gpu.use_row_bits(cuda_backend_detail::gemv_row_bits(gpu.config, step.get()));
  plan.backend_state = step;
  if (token_ids.empty()) return {};
  return Tensor(nullptr, device_token_ids, ScalarType::kI32, {plan.total_q()}, DeviceKind::kCuda, "token_ids");
}

Tensor CudaBackend::step_positions(const AttentionPlan& plan) {
  const auto& step = impl_->step_state(plan, "step_positions");
  return Tensor(nullptr, const_cast<int32_t*>(step.positions), ScalarType::kI32, {plan.total_q()}, DeviceKind::kCuda,
                "positions");
}

std::vector<int32_t> CudaBackend::decode_batch_ladder(int32_t max_batch) const {
  std::vector<int32_t> ladder;
  if (!impl_->config.cuda_graphs || max_batch < 1) return ladder;
  for (int32_t batch = 1; batch < max_batch;) {
    ladder.push_back(batch);
    // 8, 12, 16, 24, 32, 48, 64, 96, ...
    batch = batch < 8 ? batch * 2 : batch + (batch & (batch - 1) ? batch / 3 : batch / 2);
  }
  ladder.push_back(max_batch);
  return ladder;
}

double CudaBackend::time_ms(const std::function<void()>& work) {
  Impl& gpu = *impl_;
  gpu.enter();
  cudaEvent_t start = nullptr, stop = nullptr;
  gpu.check(cudaEventCreate(&start), "timing event");
  gpu.check(cudaEventCreate(&stop), "timing event");
  float ms = 0.0f;
  try {
    gpu.check(cudaEventRecord(start, gpu.stream), "timing event record");
    work();
    gpu.check(cudaEventRecord(stop, gpu.stream), "timing event record");
    gpu.check(cudaEventSynchronize(stop), "timing event wait");
    gpu.check(cudaEventElapsedTime(&ms, start, stop), "timing event elapsed");
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

Tensor CudaBackend::run_step(const void* owner, const std::function<Tensor()>& forward) {
  Impl& gpu = *impl_;
  gpu.enter();
  const std::shared_ptr<Impl::StepState> step = gpu.current_step;
  if (step == nullptr || !step->graph_eligible) return forward();
  if (const int64_t generation = gpu.layout_generation + gpu.device_frees->load();
      generation != gpu.graphs_generation) {
    gpu.drop_graphs();
    gpu.graphs_generation = generation;
  }
  const Impl::GraphKey key{reinterpret_cast<uintptr_t>(owner), static_cast<int32_t>(step->host_last_rows.size()),
                           step->table_width, step->step_keys,
                           cuda_backend_detail::invariant_rows(gpu.config, step.get()), step->encoder_tokens};
  if (auto it = gpu.graphs.find(key); it != gpu.graphs.end()) {
    gpu.check(cudaGraphLaunch(it->second.exec, gpu.stream), "step graph replay");
    ++gpu.replays;
    return it->second.output;
  }
  // The first step of a shape runs eagerly: it sizes the workspaces and plans the GEMMs, which a
  // capture cannot do. The next one is captured.
  if (gpu.warmed.insert(key).second) return forward();
  if (gpu.graphs.size() >= Impl::kMaxGraphs) gpu.drop_graphs();  // many shapes seen: start over
  gpu.capturing = true;
  gpu.check(cudaStreamBeginCapture(gpu.stream, cudaStreamCaptureModeThreadLocal), "step graph capture");
  Tensor output;
  cudaGraph_t graph = nullptr;
  try {
    output = forward();
  } catch (...) {
    cudaStreamEndCapture(gpu.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    gpu.capturing = false;
    throw;
  }
  gpu.capturing = false;
  gpu.check(cudaStreamEndCapture(gpu.stream, &graph), "step graph capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  gpu.check(e, "step graph instantiate");
  gpu.graphs[key] = {exec, output};
  ++gpu.captured;
  gpu.check(cudaGraphLaunch(exec, gpu.stream), "step graph replay");
  return output;
}

}  // namespace tessera
