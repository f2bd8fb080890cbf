#!/usr/bin/env python3
"""bench/experiments/decode_timeline/instrument.py: writes OUT, a copy of kernels/cuda/attention/decode.cuh
with timeline marks (trace.cuh) at the phases of a launch:
  0 start; 1 block table read; 2 ring filled (before the programmatic-launch wait); 3 wait passed;
  4 warp 0's tiles done; 5 partials written and counted; 6 merge done (the merging CTA).
-DDIAG_UNPACED fills the ring without waiting tile by tile; -DDIAG_EARLY_RELEASE releases the next
launch at the kernel's start instead of after its wait. Each edit asserts that the code it marks is
still there, so a changed kernel fails here rather than being timed wrong.
  usage: instrument.py REPO OUT"""
import sys

repo, out = sys.argv[1], sys.argv[2]
src = open(f"{repo}/kernels/cuda/attention/decode.cuh").read()


def mark(old, new):
    global src
    assert src.count(old) == 1, f"decode.cuh changed: {old!r}"
    src = src.replace(old, new)


mark("#pragma once", '#pragma once\n#include "trace.cuh"')
mark("  const int split = blockIdx.x, seq = blockIdx.z;\n",
     "  DIAG_BEGIN();\n#ifdef DIAG_EARLY_RELEASE\n  pdl_launch_dependents();\n#endif\n"
     "  const int split = blockIdx.x, seq = blockIdx.z;\n")
mark("      if (i < n) rows[i] = (blk[r] << block_shift) + ((v_begin + i) & (args.block_size - 1));\n    }\n",
     "      if (i < n) rows[i] = (blk[r] << block_shift) + ((v_begin + i) & (args.block_size - 1));\n    }\n"
     "    DIAG_MARK(1);\n")
mark("      cp_async_commit();\n      cp_async_wait<0>();\n    }\n  };",
     "      cp_async_commit();\n#ifndef DIAG_UNPACED\n      cp_async_wait<0>();\n#endif\n    }\n  };")
mark("  if (!fill_after_wait) fill_ring(newest);\n",
     "  if (!fill_after_wait) fill_ring(newest);\n#ifdef DIAG_UNPACED\n  cp_async_wait<0>();\n#endif\n  DIAG_MARK(2);\n")
mark("  pdl_wait_previous();\n  pdl_launch_dependents();\n",
     "  pdl_wait_previous();\n  DIAG_MARK(3);\n#ifndef DIAG_EARLY_RELEASE\n  pdl_launch_dependents();\n#endif\n")
mark("  cp_async_wait<0>();\n#pragma unroll\n  for (int off = 4; off < 32; off <<= 1) {\n    l0 +=",
     "  cp_async_wait<0>();\n  DIAG_MARK(4);\n#pragma unroll\n  for (int off = 4; off < 32; off <<= 1) {\n    l0 +=")
mark("  __syncthreads();\n  if (!is_last) return;\n", "  __syncthreads();\n  DIAG_MARK(5);\n  if (!is_last) return;\n")
mark("  if (threadIdx.x == 0) *counter = 0;\n}",
     "  __syncthreads();\n  DIAG_MARK(6);\n  if (threadIdx.x == 0) *counter = 0;\n}")
open(out, "w").write(src)
