"""The batch-invariant CPU kernels (the C files beside this one) on torch tensors: shapes
checked, outputs allocated, each call one C function bound in abi.py."""

import ctypes
import platform

import numpy as np
import torch

from batchproof.engine.memory import drop_mapped_range
from batchproof.engine.model.ops.abi import ACTIVATIONS, MAX_PARTS, Layer, Moe, Shape, Weight
from batchproof.engine.model.ops.abi import load_library as _library
from batchproof.engine.model.weights import (
    COPY_CHUNK_BYTES,
    QuantPart,
    QuantWeight,
    RawTensor,
    owned_rows,
    same_type_runs,
)

# Level 1 is each architecture's first vector set: AVX2 + FMA on x86, NEON on aarch64 (isa.c).
ARM = platform.machine().lower() in ("aarch64", "arm64")
ISA_NAMES = {1: "neon", 0: "portable"} if ARM else {2: "avx512", 1: "avx2", 0: "portable"}
# --max-isa's names -> levels, caps by number: on ARM avx2 and avx512 cap at NEON (its best), on x86 neon at AVX2
ISA_LEVELS = {"avx512": 2, "avx2": 1, "neon": 1, "portable": 0}


def available() -> bool:
    return _library() is not None


def kernel_name() -> str | None:
    lib = _library()
    return None if lib is None else f"batchproof-{ISA_NAMES[lib.bp_isa_level()]}"


def isa_level() -> int:
    """2: AVX-512, 1: AVX2 + FMA (NEON on aarch64), 0: portable C; only the speed differs, never the bits."""
    return _library().bp_isa_level()


def numerics_version() -> str:
    """The name of the kernels' arithmetic: two builds with the same version give the same
    bits on any x86 host, whichever instruction set each uses."""
    return _library().bp_numerics_version().decode()


def cap_isa_level(cap: int) -> None:
    """Use at most this instruction set from now on (tests run every path on one machine)."""
    _library().bp_cap_isa_level(cap)


def prefer_pairs(prefer: bool | None) -> None:
    """Force the AVX-512 one-row float tile to pair two weight rows a register (True) or not
    (False), or leave it to the CPU (None: not on Zen 4); tests run both paths anywhere."""
    _library().bp_prefer_pairs(-1 if prefer is None else int(prefer))


def allow_vnni(allow: bool) -> None:
    """Let the int8 tiles use AVX-512 VNNI where the CPU has it (tests turn it off to run what a
    CPU with AVX-512 and no VNNI runs)."""
    _library().bp_allow_vnni(int(allow))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _output(out: torch.Tensor | None, m: int, n: int) -> torch.Tensor:
    """A matmul's [m, n] result: `out` when the caller lends one, else a new tensor."""
    if out is None:
        return torch.empty(m, n, dtype=torch.float32)
    assert out.shape == (m, n) and out.is_contiguous() and out.dtype == torch.float32 and out.device.type == "cpu"
    return out


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, num_threads: int,
           residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] @ w[N, K]^T (+ b[N]) -> [M, N]; each output summed in a fixed order.

    With `residual` ([M, N], contiguous), the product is added into it in place and it is
    returned: `residual + linear(x)` without a second pass over memory. With `out` (the
    same shape), the product is written there instead of a new tensor.
    """
    lib = _library()
    assert lib is not None and x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and w.is_contiguous() and (b is None or b.is_contiguous())
    if residual is None:
        y = _output(out, m, n)
    else:
        assert residual.shape == (m, n) and residual.is_contiguous() and residual.dtype == torch.float32
        y = residual
    lib.bp_linear_f32(_ptr(x), _ptr(w), _ptr(b), _ptr(y), m, n, k, int(residual is not None), num_threads)
    return y


def runs_natively(qtype: int) -> bool:
    """Whether our kernels multiply this GGML type straight from its blocks."""
    return _library().bp_block_bytes(qtype) > 0


def block_size(qtype: int) -> tuple[int, int]:
    """(weights, bytes) of one block of a GGML type, as gguf's GGML_QUANT_SIZES; (0, 0) for
    a type our kernels do not run."""
    lib = _library()
    return lib.bp_block_elems(qtype), lib.bp_block_bytes(qtype)


def linear_q(x: torch.Tensor, w: QuantWeight, b: torch.Tensor | None, num_threads: int,
             residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """linear() on a weight kept in its GGUF blocks: bitwise the float32 kernel's result on
    the dequantized weight. Each part (Q, K, V may differ in type) fills its own columns."""
    assert all(part.layout == "blocks" for part in w.parts), "an int8-layout weight in the float numerics"
    return _linear_blocks(_library().bp_linear_q, x, w, b, num_threads, residual, out)


# The int8 numerics' own version (quant_int8.h's definition): change it whenever its bits change.
INT8_NUMERICS = "int8a-b32-v1"


def linear_q_int8(x: torch.Tensor, w: QuantWeight, b: torch.Tensor | None, num_threads: int,
                  residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """linear_q() in the int8 numerics (quant_int8.h): each row of x quantized to int8 per block
    of 32 on its own, integer block dots, one fixed float order across blocks; F16/BF16 parts
    run as in linear_q."""
    assert all(part.layout == "int8x8" or not _library().bp_int8_packed_bytes(part.qtype, 8, w.shape[1])
               for part in w.parts), "a weight not in the int8 layout (int8_layout)"
    return _linear_blocks(_library().bp_linear_q_int8, x, w, b, num_threads, residual, out)


def int8_layout(w: QuantWeight) -> QuantWeight:
    """w in the int8 numerics' layout: each quantized part repacked 8 rows interleaved (its
    scales kept compact, bp_int8_repack), a part at a time; F16/BF16/F32 parts as they are."""
    return QuantWeight(tuple(_int8_part([part.data], part.qtype, part.rows, w.shape[1]) if part.layout == "blocks"
                             else part for part in w.parts), w.shape)


def int8_weight(*tensors: RawTensor) -> QuantWeight:
    """quant_weight(*tensors) held in the int8 layout, repacked straight from the file's rows a
    few MB at a time, each piece's file pages dropped once read: the file's tensor, a copy in
    blocks and the repacked one are never resident together (Gemma 3's 170 MB embedding was)."""
    k = tensors[0].shape[1]
    parts = []
    for group in same_type_runs(tensors):
        rows = sum(t.shape[0] for t in group)
        if all(t.shape[0] % 8 == 0 for t in group[:-1]):  # each tensor starts on a tile of its own
            parts.append(_int8_part([t.data for t in group], group[0].qtype, rows, k))
        else:
            parts.append(_int8_part([owned_rows([t.data for t in group])], group[0].qtype, rows, k))
    return QuantWeight(tuple(parts), (sum(t.shape[0] for t in tensors), k))


def _int8_part(sources: list[np.ndarray], qtype: int, rows: int, k: int) -> QuantPart:
    """Rows of blocks (stacked, every source but the last a whole number of tiles) repacked, or
    kept in blocks where the type has no int8 kernel (F16, BF16, F32)."""
    lib = _library()
    size = lib.bp_int8_packed_bytes(qtype, rows, k)
    if not size:
        return QuantPart(owned_rows(sources), qtype, rows)
    tiles = (rows + 7) // 8
    packed = np.empty((tiles, size // tiles), dtype=np.uint8)
    tile = 0
    for source in sources:
        step = max(8, COPY_CHUNK_BYTES // max(1, source.shape[1]) // 8 * 8)
        for start in range(0, source.shape[0], step):
            piece = np.ascontiguousarray(source[start:start + step])
            lib.bp_int8_repack(piece.ctypes.data, qtype, piece.shape[1], piece.shape[0], k,
                               packed[tile + start // 8:].ctypes.data)
            drop_mapped_range(source[start:start + step])
        tile += source.shape[0] // 8
    return QuantPart(packed, qtype, rows, "int8x8")


def _linear_blocks(kernel, x: torch.Tensor, w: QuantWeight, b: torch.Tensor | None, num_threads: int,
                   residual: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    assert x.dtype == torch.float32 and x.device.type == "cpu"
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and (b is None or b.is_contiguous())
    if residual is None:
        y = _output(out, m, n)
    else:
        assert residual.shape == (m, n) and residual.is_contiguous() and residual.dtype == torch.float32
        y = residual
    for part, offset in zip(w.parts, w.offsets):
        bias = None if b is None else b.data_ptr() + 4 * offset
        kernel(_ptr(x), part.address, part.qtype, part.data.shape[1], bias,
               y.data_ptr() + 4 * offset, n, m, part.rows, k, int(residual is not None), num_threads)
    return y


def dequant_rows(w: QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a one-part quantized weight as float32 [len(ids), K] (the embedding lookup)."""
    (part,) = w.parts
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], w.shape[1], dtype=torch.float32)
    if part.layout == "int8x8":  # the same floats, read from the int8 numerics' layout
        _library().bp_int8_dequant_rows(part.address, part.qtype, w.shape[1], _ptr(ids), ids.shape[0],
                                        _ptr(out))
    else:
        _library().bp_dequant_rows(part.address, part.qtype, part.data.shape[1], w.shape[1], _ptr(ids),
                                   ids.shape[0], _ptr(out))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[rows, dim] -> [rows, dim], each row normalised on its own."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _library().bp_rms_norm_f32(_ptr(x), _ptr(weight), _ptr(y), x.shape[0], x.shape[1], eps)
    return y


def rope_(rows: torch.Tensor, num_heads: int, head_dim: int, rope_dim: int, positions: torch.Tensor,
          cos: torch.Tensor, sin: torch.Tensor, style: str) -> None:
    """Rotate the first num_heads heads of each row of a contiguous [n, width] tensor, in place."""
    assert rows.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    positions = positions.to(torch.int64).contiguous()
    _library().bp_rope_f32(_ptr(rows), rows.shape[0], rows.shape[1], num_heads, head_dim, rope_dim,
                           _ptr(positions), _ptr(cos), _ptr(sin), 0 if style == "adjacent" else 1)


def silu_mul(gate_up: torch.Tensor, num_threads: int = 1) -> torch.Tensor:
    """[rows, 2 * ffn] ([gate | up]) -> silu(gate) * up, [rows, ffn], every element by the same code."""
    return _gated(gate_up, _library().bp_silu_mul_f32, num_threads)


def gelu_tanh_mul(gate_up: torch.Tensor, num_threads: int = 1) -> torch.Tensor:
    """[rows, 2 * ffn] ([gate | up]) -> gelu_tanh(gate) * up (Gemma), every element by the same code."""
    return _gated(gate_up, _library().bp_gelu_tanh_mul_f32, num_threads)


def _gated(gate_up: torch.Tensor, kernel, num_threads: int) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape
    y = torch.empty(rows, width // 2, dtype=torch.float32)
    kernel(_ptr(gate_up), _ptr(y), rows, width // 2, num_threads)
    return y


def fma_peak(seconds: float, num_threads: int) -> float:
    """Floating-point operations done by `seconds` of independent FMAs on each thread (the
    bench's roofline times the call)."""
    return _library().bp_fma_peak(seconds, num_threads)


def int_dot_peak(seconds: float, num_threads: int) -> float:
    """Integer operations done by `seconds` of the int8 numerics' integer dots on each thread."""
    return _library().bp_int_dot_peak(seconds, num_threads)


def read_bandwidth(num_bytes: int, num_threads: int, num_runs: int) -> float:
    """Bytes a second of the best of `num_runs` sums over a buffer of `num_bytes` (0: no memory)."""
    return _library().bp_read_bandwidth(num_bytes, num_threads, num_runs)


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 -> [B] int64: each row's first maximum, NaN never; -1 where none beats -inf."""
    logits = logits.contiguous()
    ids = torch.empty(logits.shape[0], dtype=torch.int64)
    _library().bp_first_max_f32(_ptr(logits), logits.shape[0], logits.shape[1], _ptr(ids))
    return ids


def sample(usable: torch.Tensor, params, u: float, want_processed: bool) -> tuple[int, torch.Tensor | None]:
    """sampler.SampleRow on sample.c: the distribution and the draw in one fixed order."""
    row = usable.detach().to("cpu", torch.float32).contiguous()
    processed = torch.empty_like(row) if want_processed else None
    chosen = _library().bp_sample_f32(_ptr(row), row.shape[0], params.temperature, params.top_k, params.top_p,
                                      params.min_p, u, _ptr(processed))
    if chosen < 0:
        raise MemoryError("the sampler could not allocate its scratch rows")
    return chosen, processed.to(usable.device) if processed is not None else None


def rope_tables(rope_dim: int, base: float, max_len: int, freq_factors: torch.Tensor | None,
                linear_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, rope_dim / 2] by sample.c's bp_rope_tables: the same bits on every host."""
    half = rope_dim // 2
    cos, sin = torch.empty(max_len, half), torch.empty(max_len, half)
    factors = None if freq_factors is None else freq_factors.detach().to("cpu", torch.float32).contiguous()
    _library().bp_rope_tables(rope_dim, base, max_len, _ptr(factors), linear_factor, _ptr(cos), _ptr(sin))
    return cos, sin


def top_k_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """[B, V] -> (ids [B, k], logits [B, k], row max [B], log_total [B], counts [B]): each
    row's best k (NaN never, ties to the lower id) and its normaliser, in one pass."""
    logits = logits.contiguous()
    b, v = logits.shape
    ids = torch.empty(b, k, dtype=torch.int64)
    values = torch.empty(b, k, dtype=torch.float32)
    row_max, log_total = torch.empty(b, dtype=torch.float32), torch.empty(b, dtype=torch.float32)
    counts = torch.empty(b, dtype=torch.int64)
    _library().bp_top_k_logprobs_f32(_ptr(logits), b, v, k, _ptr(ids), _ptr(values), _ptr(row_max),
                                     _ptr(log_total), _ptr(counts))
    return ids, values, row_max, log_total, counts


def tail_logprobs(logits: torch.Tensor, row_max: torch.Tensor, log_total: torch.Tensor, top_ids: torch.Tensor,
                  num_shown: torch.Tensor) -> torch.Tensor:
    """[B, V] logits, their normaliser's row max and log_total [B], top ids [B, k] and num_shown [B]
    -> [B]: each row's logprob outside its first num_shown ids, in the normaliser's own terms."""
    logits = logits.float().contiguous()
    b, v = logits.shape
    ids = top_ids.to(torch.int64).contiguous()
    shown = num_shown.to(torch.int64).contiguous()
    if ids.shape[0] != b or shown.shape != (b,):
        raise ValueError(f"tail_logprobs: top_ids {tuple(ids.shape)} and num_shown {tuple(shown.shape)} "
                         f"need one row each of the {b} logits rows")
    k = ids.shape[1]
    if bool(((shown < 0) | (shown > k)).any()):
        raise ValueError(f"tail_logprobs: num_shown must be in 0..{k} (the top_ids per row)")
    is_shown = torch.arange(k)[None, :] < shown[:, None]
    if bool((is_shown & ((ids < 0) | (ids >= v))).any()):
        raise ValueError(f"tail_logprobs: a shown top_ids entry is outside the vocabulary 0..{v - 1}")
    row_max, log_total = row_max.float().reshape(b).contiguous(), log_total.float().reshape(b).contiguous()
    tails = torch.empty(b, dtype=torch.float32)
    if _library().bp_tail_logprobs_f32(_ptr(logits), b, v, _ptr(row_max), _ptr(log_total), _ptr(ids), k,
                                       _ptr(shown), _ptr(tails)) != 0:
        raise MemoryError("the tail kernel could not allocate its scratch row")
    return tails


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scale: float, num_threads: int, window: int = 0) -> torch.Tensor:
    """q: [B, H, D]; k_cache, v_cache: [slots, KVH, max_len, D] of one layer -> [B, H, D]; with a
    window W > 0, a row of length L attends only its last min(L, W) keys."""
    lib = _library()
    assert lib is not None and k_cache.is_contiguous() and v_cache.is_contiguous()
    q = q.contiguous()
    b, h, d = q.shape
    kvh, max_len = k_cache.shape[1], k_cache.shape[2]
    slots = slots.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    lib.bp_decode_attention_f32(
        _ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(out), _ptr(slots), _ptr(lengths),
        b, h, kvh, d, max_len, window, scale, num_threads,
    )
    return out


def prompt_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, start: int,
                     scale: float, num_threads: int, window: int = 0) -> torch.Tensor:
    """q: [n, H, D] at positions start.. of `slot` -> [n, H, D]; row i equals
    decode_attention's row with length start + i + 1 and the same window."""
    lib = _library()
    assert lib is not None and k_cache.is_contiguous() and v_cache.is_contiguous()
    q = q.contiguous()
    n, h, d = q.shape
    kvh, max_len = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    lib.bp_prompt_attention_f32(_ptr(q), _ptr(k_cache), _ptr(v_cache), _ptr(out), slot, start, n, h, kvh, d, max_len,
                                window, scale, num_threads)
    return out


# --- the fused decode step: every layer in one call (layers.c) ----------------------------------

def _weight(w: torch.Tensor | QuantWeight | None) -> Weight:
    out = Weight()
    if w is None:  # a routed layer's dense MLP: none (its experts are in its Moe)
        return out
    if isinstance(w, QuantWeight):
        assert len(w.parts) <= MAX_PARTS
        out.num_parts = len(w.parts)
        for i, part in enumerate(w.parts):
            out.types[i], out.data[i], out.rows[i] = part.qtype, part.address, part.rows
            out.row_bytes[i] = part.data.shape[1]
    else:
        assert w.dtype == torch.float32 and w.is_contiguous()
        out.num_parts, out.types[0], out.data[0] = 1, 0, w.data_ptr()
        out.rows[0], out.row_bytes[0] = w.shape[0], w.shape[1] * 4
    return out


class DecodeLayers:
    """A model's layers over one KV cache, described once, so a decode step runs them all in
    one C call; `keep` holds every tensor whose address the description records.

    ropes[i] and windows[i]: layer i's RoPE tables (cos, sin) and sliding window (0: none); a routed
    layer's router and experts are described as bp_moe (moe.c), kept in `moes`."""

    def __init__(self, spec, layers: list, ropes: list[tuple[torch.Tensor, torch.Tensor]], windows: list[int],
                 k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float, is_int8: bool = False) -> None:
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        assert all(cos.is_contiguous() and sin.is_contiguous() for cos, sin in ropes)
        self.keep = (layers, ropes, k_cache, v_cache)
        self.shape = Shape(spec.dim, spec.ffn_dim, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rope_dim,
                           k_cache.shape[3], 0 if spec.rope_style == "adjacent" else 1, ACTIVATIONS[spec.mlp_act],
                           spec.norm_eps, scale, int(is_int8))
        self.layers = (Layer * len(layers))()
        self.moes = []  # each routed layer's Moe and its experts' arrays: the layers hold their addresses
        for i, (layer, (cos, sin), window) in enumerate(zip(layers, ropes, windows, strict=True)):
            assert (layer.q_norm is None) == (layer.k_norm is None)
            assert (layer.q_norm_full is None) == (layer.k_norm_full is None)
            moe = None if layer.moe is None else self._moe(layer.moe, spec)
            self.layers[i] = Layer(
                _ptr(layer.attn_norm), _ptr(layer.ffn_norm), _ptr(layer.bqkv), _ptr(layer.q_norm),
                _ptr(layer.k_norm), _ptr(layer.post_attn_norm), _ptr(layer.post_ffn_norm), _weight(layer.wqkv),
                _weight(layer.wo), _weight(layer.w_gate_up), _weight(layer.w_down), _ptr(cos), _ptr(sin), window,
                _ptr(k_cache[i]), _ptr(v_cache[i]), _ptr(layer.q_norm_full), _ptr(layer.k_norm_full),
                None if moe is None else ctypes.addressof(moe),
            )

    def _moe(self, moe, spec) -> Moe:
        gate_up = (Weight * len(moe.gate_up))(*map(_weight, moe.gate_up))
        down = (Weight * len(moe.down))(*map(_weight, moe.down))
        out = Moe(_weight(moe.router), ctypes.addressof(gate_up), ctypes.addressof(down), len(moe.down),
                  spec.num_experts_used, moe.gate_up[0].shape[0] // 2, int(spec.is_topk_normalised))
        self.moes.append((out, gate_up, down))
        return out

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, num_threads: int,
                 routes: torch.Tensor | None = None) -> None:
        """x: [rows, dim] residual stream, updated in place through every layer; routes, when
        given: [routed layers, rows, k] int64, filled with each routed layer's experts."""
        assert x.is_contiguous() and x.dtype == torch.float32
        assert routes is None or (routes.dtype == torch.int64 and routes.is_contiguous()
                                  and routes.shape[:2] == (len(self.moes), x.shape[0]))
        positions = positions.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        _library().bp_decode_layers(ctypes.byref(self.shape), self.layers, len(self.layers), _ptr(x), x.shape[0],
                                    _ptr(positions), _ptr(slots), _ptr(routes), num_threads)
