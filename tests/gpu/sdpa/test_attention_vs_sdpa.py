"""tests/gpu/sdpa/test_attention_vs_sdpa.py: Tessera's attention kernels (varlen prefill, chunked
prefill over the paged KV cache, paged decode) against torch's scaled_dot_product_attention in fp32
on the same rounded inputs, with the boolean mask each policy defines (kernels/attention_mask.h).

The kernels are reached through tessera_attention_shim (attention_shim.cpp), loaded with ctypes from
$TESSERA_ATTENTION_SHIM; run_sdpa_tests.sh runs this on the GPU machine. Without torch, a CUDA GPU or
the shim (CI, or any machine without a GPU) every test is skipped."""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import random
import zlib
from dataclasses import dataclass

import pytest

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    torch = None
SHIM_PATH = os.environ.get("TESSERA_ATTENTION_SHIM", "")


def why_skipped() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU present"
    if not os.path.isfile(SHIM_PATH):
        return f"TESSERA_ATTENTION_SHIM ({SHIM_PATH!r}) names no file: build tessera_attention_shim and point it there"
    return None


# A mark, not a module-level skip: pytest exits 5 (no tests collected) when every module skips itself.
SKIPPED_BECAUSE = why_skipped()
pytestmark = pytest.mark.skipif(SKIPPED_BECAUSE is not None, reason=SKIPPED_BECAUSE or "")

# MaskKind, DType and PrefillKernel values (kernels/attention_mask.h, kernels/cuda/common/dtype.h,
# kernels/cuda/attention/attention.h).
CAUSAL, BIDIRECTIONAL, SLIDING_WINDOW, SEGMENTS = 0, 1, 2, 3
SHIM_DTYPE = {"bf16": 0, "fp16": 1}
KERNELS = {"auto": 0, "mma_sync": 1}  # auto: the Hopper kernel on an H100, for every head dim here

# Max-abs error against fp32 SDPA, for outputs of magnitude up to 1 (values are in [-1, 1]): a
# bf16 output alone rounds by up to 2e-3 there, fp16 by 2.5e-4; P is rounded to the dtype too.
MAX_ABS_ERROR = {"bf16": 2e-2, "fp16": 5e-3}
HEAD_DIMS = [64, 128, 256]
DTYPES = ["fp16", "bf16"]
LENGTHS = [1, 17, 1000, 4097]  # one token, under a tile, mid-tile, one past a power of two
# Paged cache block size per dtype: both sizes the kernels take, without doubling the cases.
BLOCK_SIZE = {"fp16": 16, "bf16": 32}


def torch_dtype(name: str) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass(frozen=True)
class Policy:
    name: str
    kind: int
    window: int = 0
    sinks: int = 0
    pass_masks: bool = True  # decode only: False runs the kernel with no masks at all (all causal)

    def segments(self, kv_len: int) -> tuple[int, list[int]]:
        """(shared_prefix, segment_ends) for a sequence of kv_len keys, empty for other kinds."""
        return segment_layout(kv_len) if self.kind == SEGMENTS else (0, [])


def segment_layout(kv_len: int) -> tuple[int, list[int]]:
    """A shared prefix and segment boundaries on and just past 64/128-key tile edges, a one-token
    segment, and a tail of two keys after the last segment, where the length allows."""
    prefix = 64 if kv_len > 256 else min(3, kv_len - 1)
    ends = sorted({e for e in (prefix + 1, kv_len // 2, 128, 193, 2048, kv_len - 97, kv_len - 2)
                   if prefix < e < kv_len - 1})
    return prefix, ends


POLICIES = [
    Policy("causal", CAUSAL),
    Policy("bidirectional", BIDIRECTIONAL),
    # Window edges on and one past a tile edge, sinks inside the first tile and filling it.
    Policy("window128_sinks4", SLIDING_WINDOW, window=128, sinks=4),
    Policy("window192", SLIDING_WINDOW, window=192),
    Policy("window65_sinks64", SLIDING_WINDOW, window=65, sinks=64),
    Policy("segments", SEGMENTS),
]
DECODE_POLICIES = POLICIES + [Policy("causal_no_masks", CAUSAL, pass_masks=False)]


def visible_keys(policy: Policy, q_len: int, kv_len: int) -> torch.Tensor:
    """[q_len, kv_len] bool: MaskParams::visible for queries at positions kv_len - q_len .. kv_len - 1
    (bottom-right aligned, as the kernels place them)."""
    q = torch.arange(kv_len - q_len, kv_len, device="cuda")[:, None]
    k = torch.arange(kv_len, device="cuda")[None, :]
    causal = k <= q
    if policy.kind == BIDIRECTIONAL:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device="cuda")
    if policy.kind == CAUSAL:
        return causal
    if policy.kind == SLIDING_WINDOW:
        return causal & ((k > q - policy.window) | (k < policy.sinks))
    prefix, ends = policy.segments(kv_len)
    in_segments = (q >= prefix) & (q < (ends[-1] if ends else prefix))
    segment_start = torch.full_like(q, prefix)
    for start, end in zip([prefix] + ends[:-1], ends):
        segment_start = torch.where((q >= start) & (q < end), start, segment_start)
    return causal & (~in_segments | (k < prefix) | (k >= segment_start))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
         dtype: torch.dtype) -> torch.Tensor:
    """torch SDPA of one sequence in dtype: q [q_len, H, D], k and v [kv_len, KV, D], each KV head
    repeated for its group of query heads (GQA). A query that sees no key gets 0, as in the kernels."""
    group = q.shape[1] // k.shape[1]

    def as_batch(x: torch.Tensor) -> torch.Tensor:  # [1, heads, rows, D]
        return x.to(dtype).transpose(0, 1).unsqueeze(0)

    sees_any = visible.any(dim=1)
    mask = visible | ~sees_any[:, None]  # a row with no key would be NaN in some backends: zeroed below
    out = F.scaled_dot_product_attention(as_batch(q), as_batch(k.repeat_interleave(group, dim=1)),
                                         as_batch(v.repeat_interleave(group, dim=1)), attn_mask=mask,
                                         scale=1.0 / math.sqrt(q.shape[2]))
    return out.squeeze(0).transpose(0, 1) * sees_any[:, None, None]


def references(q, k, v, policy: Policy) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA in fp32 on the math backend (the reference), and torch's own SDPA in the inputs' dtype on
    whichever backend it picks (only printed, to show what error a production kernel has on the case)."""
    visible = visible_keys(policy, q.shape[0], k.shape[0])
    with sdpa_kernel([SDPBackend.MATH]):
        reference = sdpa(q, k, v, visible, torch.float32)
    try:
        torch_half = sdpa(q, k, v, visible, q.dtype)
    except RuntimeError:  # a backend's refusal must not fail a test of Tessera's kernels
        torch_half = torch.full_like(reference, math.nan)
    return reference, torch_half


WORST_ERRORS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def worst_error_summary():
    yield
    for key, err in sorted(WORST_ERRORS.items()):
        print(f"worst max-abs error {key}: {err:.2e}")


def assert_close(request, out: torch.Tensor, reference: torch.Tensor, torch_half: torch.Tensor, op: str,
                 dtype: str):
    finite = bool(torch.isfinite(out).all())
    err = (out.float() - reference).abs().max().item() if finite else math.inf
    torch_err = (torch_half.float() - reference).abs().max().item()
    bound = MAX_ABS_ERROR[dtype]
    print(f"\n{request.node.name}: max |tessera - sdpa fp32| {err:.2e} (torch {dtype} sdpa {torch_err:.2e}, "
          f"max |ref| {reference.abs().max().item():.2f}, bound {bound:.0e})")
    request.node.user_properties.append(("max_abs_error", err))
    key = f"{op} {dtype}"
    WORST_ERRORS[key] = max(WORST_ERRORS.get(key, 0.0), err)
    assert finite, "non-finite output (rows left unwritten are NaN)"
    assert err <= bound, f"max-abs error {err:.2e} over {bound:.0e} (torch's own sdpa: {torch_err:.2e})"


@pytest.fixture
def gen(request) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(zlib.crc32(request.node.name.encode()))


def random_qkv(q_rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int, dtype, gen):
    """q and k ~ N(0, 1), v uniform in [-1, 1]. Query heads are scaled from 0.5 to 3: from attention
    spread over many keys (long sums, outputs near 0) to attention on a few (outputs of magnitude ~1)."""
    scales = torch.linspace(0.5, 3.0, heads, device="cuda")[None, :, None]
    q = (torch.randn(q_rows, heads, head_dim, device="cuda", generator=gen) * scales).to(dtype)
    k = torch.randn(kv_rows, kv_heads, head_dim, device="cuda", generator=gen).to(dtype)
    v = (torch.rand(kv_rows, kv_heads, head_dim, device="cuda", generator=gen) * 2 - 1).to(dtype)
    return q, k, v


def load_shim(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    i, p, f, rows = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.POINTER(ctypes.c_int32)
    signatures = {
        # dtype, kernel, out, q, k, v, cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q, total_q, total_k,
        # num_heads, num_kv_heads, head_dim, mask_rows, segment_ends, softmax_scale, stream
        "tessera_shim_prefill": [i, i, p, p, p, p, p, p, i, i, i, i, i, i, i, rows, p, f, p],
        # dtype, kernel, out, q, k_cache, v_cache, num_blocks, block_size, block_tables, max_blocks_per_seq,
        # cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q, total_q, total_k, num_heads, num_kv_heads,
        # head_dim, mask_rows, segment_ends, softmax_scale, stream
        "tessera_shim_chunked_prefill": [i, i, p, p, p, p, i, i, p, i, p, p, i, i, i, i, i, i, i, rows, p, f, p],
        # dtype, out, q, k_cache, v_cache, block_size, block_tables, max_blocks_per_seq, context_lens,
        # max_context_len, num_seqs, num_heads, num_kv_heads, head_dim, mask_rows, segment_ends,
        # softmax_scale, stream
        "tessera_shim_decode": [i, p, p, p, p, i, p, i, p, i, i, i, i, i, rows, p, f, p],
    }
    for name, argtypes in signatures.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = ctypes.c_char_p
    return lib


SHIM = load_shim(SHIM_PATH) if SKIPPED_BECAUSE is None else None


def call_shim(name: str, *args) -> None:
    error = getattr(SHIM, name)(*args)
    assert not error, f"{name}: {error.decode()}"


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def mask_arguments(policies: list[Policy], kv_lens: list[int]):
    """The shim's host rows (kind, window, sinks, shared_prefix, num_segments per sequence) and the
    device tensor of every sequence's segment ends back to back (None when there are none). The
    tensor must outlive the call."""
    rows, ends = [], []
    for policy, kv_len in zip(policies, kv_lens):
        prefix, segment_ends = policy.segments(kv_len)
        rows += [policy.kind, policy.window, policy.sinks, prefix, len(segment_ends)]
        ends += segment_ends
    ends_tensor = torch.tensor(ends, dtype=torch.int32, device="cuda") if ends else None
    return (ctypes.c_int32 * len(rows))(*rows), ends_tensor


def pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")


@dataclass
class PagedCache:
    """K/V caches [num_blocks, block_size, KV, D] with each sequence's blocks drawn from one shuffled
    pool (tables out of order, no block shared), tables [num_seqs, max_blocks] (-1 past a sequence's
    blocks, and one spare column), and each sequence's keys and values in position order."""
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def paged_cache(kv_lens: list[int], kv_heads: int, head_dim: int, block_size: int, dtype, gen) -> PagedCache:
    blocks_per_seq = [-(-n // block_size) for n in kv_lens]
    num_blocks = sum(blocks_per_seq) + 3
    _, k_cache, v_cache = random_qkv(0, num_blocks * block_size, 1, kv_heads, head_dim, dtype, gen)
    pool = list(range(num_blocks))
    random.Random(gen.initial_seed()).shuffle(pool)
    tables = torch.full((len(kv_lens), max(blocks_per_seq) + 1), -1, dtype=torch.int32)
    keys, values = [], []
    for s, (kv_len, blocks) in enumerate(zip(kv_lens, blocks_per_seq)):
        tables[s, :blocks] = torch.tensor(pool[:blocks], dtype=torch.int32)
        pool = pool[blocks:]
        positions = torch.arange(kv_len)
        slots = (tables[s, positions // block_size] * block_size + positions % block_size).cuda()
        keys.append(k_cache[slots])
        values.append(v_cache[slots])
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return PagedCache(k_cache.view(shape), v_cache.view(shape), tables.cuda(), keys, values)


def compare_by_sequence(request, out, q, keys, values, policies, q_lens, op, dtype):
    """out against the references of each sequence (q_lens rows of q each), concatenated."""
    reference, torch_half = [], []
    for s, (q_rows, policy) in enumerate(zip(torch.split(q, q_lens), policies)):
        fp32, half = references(q_rows, keys[s], values[s], policy)
        reference.append(fp32)
        torch_half.append(half)
    assert_close(request, out, torch.cat(reference), torch.cat(torch_half), op, dtype)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"len{n}")
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_prefill(request, gen, policy, length, head_dim, dtype, kernel):
    # A 3-token sequence ahead of the one under test, so that its rows start off every tile edge of
    # the packed buffers (and the Hopper kernel's TMA boxes span both). GQA: 4 query heads, 2 KV heads.
    lengths = [3, length]
    heads, kv_heads = 4, 2
    q, k, v = random_qkv(sum(lengths), sum(lengths), heads, kv_heads, head_dim, torch_dtype(dtype), gen)
    out = torch.full_like(q, math.nan)
    rows, segment_ends = mask_arguments([policy] * 2, lengths)
    cu = cu_seqlens(lengths)
    call_shim("tessera_shim_prefill", SHIM_DTYPE[dtype], KERNELS[kernel], out.data_ptr(), q.data_ptr(),
              k.data_ptr(), v.data_ptr(), cu.data_ptr(), cu.data_ptr(), len(lengths), max(lengths), sum(lengths),
              sum(lengths), heads, kv_heads, head_dim, rows, pointer(segment_ends), 1.0 / math.sqrt(head_dim),
              stream())
    compare_by_sequence(request, out, q, torch.split(k, lengths), torch.split(v, lengths), [policy] * 2, lengths,
                        f"prefill {kernel}", dtype)


# (keys of the earlier chunks, this chunk's tokens): earlier chunks that end mid-tile, a one-token
# chunk, and a chunk that takes the sequence to 4097 keys.
CHUNKS = [(100, 156), (1000, 17), (2113, 1984), (4096, 1)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("chunk", CHUNKS, ids=lambda c: f"after{c[0]}_chunk{c[1]}")
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_chunked_prefill(request, gen, policy, chunk, head_dim, dtype, kernel):
    # A second sequence (37 earlier keys, 20 new) shares the cache's block pool. MQA: 4 query heads, 1 KV.
    history, new = chunk
    q_lens, kv_lens = [20, new], [57, history + new]
    heads, kv_heads = 4, 1
    cache = paged_cache(kv_lens, kv_heads, head_dim, BLOCK_SIZE[dtype], torch_dtype(dtype), gen)
    q, _, _ = random_qkv(sum(q_lens), 0, heads, kv_heads, head_dim, torch_dtype(dtype), gen)
    out = torch.full_like(q, math.nan)
    rows, segment_ends = mask_arguments([policy] * 2, kv_lens)
    cu_q, cu_k = cu_seqlens(q_lens), cu_seqlens(kv_lens)
    call_shim("tessera_shim_chunked_prefill", SHIM_DTYPE[dtype], KERNELS[kernel], out.data_ptr(), q.data_ptr(),
              cache.k_cache.data_ptr(), cache.v_cache.data_ptr(), cache.k_cache.shape[0], cache.block_size,
              cache.tables.data_ptr(), cache.tables.shape[1], cu_q.data_ptr(), cu_k.data_ptr(), len(q_lens),
              max(q_lens), sum(q_lens), sum(kv_lens), heads, kv_heads, head_dim, rows, pointer(segment_ends),
              1.0 / math.sqrt(head_dim), stream())
    compare_by_sequence(request, out, q, cache.keys, cache.values, [policy] * 2, q_lens, f"chunked {kernel}", dtype)


# Each length alone (the split plan of a batch of one), and all of them in one batch.
CONTEXTS = [[n] for n in LENGTHS] + [LENGTHS]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("contexts", CONTEXTS, ids=lambda c: f"ctx{c[0]}" if len(c) == 1 else "mixed")
@pytest.mark.parametrize("policy", DECODE_POLICIES, ids=lambda p: p.name)
def test_decode(request, gen, policy, contexts, head_dim, dtype):
    # The query is each sequence's last position: a segments sequence's is in its tail, as a generated
    # token's is. GQA: 8 query heads, 2 KV heads.
    heads, kv_heads = 8, 2
    cache = paged_cache(contexts, kv_heads, head_dim, BLOCK_SIZE[dtype], torch_dtype(dtype), gen)
    q, _, _ = random_qkv(len(contexts), 0, heads, kv_heads, head_dim, torch_dtype(dtype), gen)
    out = torch.full_like(q, math.nan)
    rows, segment_ends = mask_arguments([policy] * len(contexts), contexts) if policy.pass_masks else (None, None)
    context_lens = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    call_shim("tessera_shim_decode", SHIM_DTYPE[dtype], out.data_ptr(), q.data_ptr(), cache.k_cache.data_ptr(),
              cache.v_cache.data_ptr(), cache.block_size, cache.tables.data_ptr(), cache.tables.shape[1],
              context_lens.data_ptr(), max(contexts), len(contexts), heads, kv_heads, head_dim, rows,
              pointer(segment_ends), 1.0 / math.sqrt(head_dim), stream())
    compare_by_sequence(request, out, q, cache.keys, cache.values, [policy] * len(contexts), [1] * len(contexts),
                        "decode", dtype)
