// models/graph_options.h: GraphOptions, the fusion switches a decoder graph is built with (the tuner's
// `fusions`, applied by a profile). The defaults are the fused graph every backend runs; switching a
// fusion off needs a backend with the unfused ops (Backend::runs_unfused_graphs), and each fusion
// beyond the defaults a backend that runs it (Backend::runs_gate_up_epilogue, runs_rope_in_kv_write),
// else it is refused naming the field.
#pragma once

#include <string>

#include "kernels/backend/backend.h"

namespace tessera {

struct GraphOptions {
  // residual add and RMSNorm in one op (Backend::add_rms_norm), or Backend::add then rms_norm.
  bool fuse_add_rms_norm = true;
  // q, k and v projections stacked into one weight and one GEMM, or three GEMMs joined by column.
  bool fuse_qkv = true;
  // gate and up projections stacked into one GEMM feeding silu_mul, or two GEMMs joined by column.
  bool fuse_gate_up = true;
  // Fusions beyond the graph every backend runs, off here (not every backend has them); a model served
  // without a profile gets those its backend runs (default_graph_options, models/model_loader.h):
  // the stacked gate-up projection and silu_mul as one op, Backend::linear_silu_mul, with the
  // SiLU·mul in the GEMV epilogue (fusions.gate_up: epilogue; needs fuse_gate_up).
  bool gate_up_epilogue = false;
  // RoPE applied as K is written to the paged KV cache, Backend::rope_attention, instead of rope()
  // then attention() (fusions.rope_kv_write: fused).
  bool rope_in_kv_write = false;

  // On a tensor-parallel group, each rank computes the logits of its slice of the vocabulary and an
  // all-gather joins them (each rank reads 1/N of the lm_head), or every rank computes them all from
  // a whole lm_head. Split where the vocabulary divides by the ranks; it reads less per token.
  bool split_lm_head = true;

  bool all_fused() const { return fuse_add_rms_norm && fuse_qkv && fuse_gate_up; }
  // "add_rms_norm=fused qkv=separate gate_up=epilogue rope_kv_write=fused", for logs and `tessera
  // info`; rope_kv_write only when fused, lm_head only when replicated.
  std::string describe() const;
  // Throws tessera::Error naming the field (fusions.add_rms_norm, fusions.gate_up,
  // fusions.rope_kv_write, ...) when a switch asks for ops the backend does not run, or when
  // gate_up_epilogue is asked without fuse_gate_up.
  void check_backend(const Backend& backend) const;
};

}  // namespace tessera
