// models/graph_options.h: GraphOptions, the fusion switches a decoder graph is built with (the tuner's
// `fusions`, applied by a profile). The defaults are the fused graph every backend runs; switching a
// fusion off needs a backend with the unfused ops (Backend::runs_unfused_graphs), else it is refused.
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

  bool all_fused() const { return fuse_add_rms_norm && fuse_qkv && fuse_gate_up; }
  // "add_rms_norm=fused qkv=separate gate_up=fused", for logs and `tessera info`.
  std::string describe() const;
  // Throws tessera::Error naming the field (fusions.add_rms_norm, ...) when a switch is off and the
  // backend has no unfused ops.
  void check_backend(const Backend& backend) const;
};

}  // namespace tessera
