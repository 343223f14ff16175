"""ctypes bindings to the batch-invariant CPU kernels in kernels.c, with torch checks."""

import ctypes
import importlib.util
from functools import cache

import torch

ISA_NAMES = {2: "avx512", 1: "avx2", 0: "portable"}


@cache
def _library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("batchproof._kernels")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.bp_linear_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.bp_linear_f32.restype = None
    lib.bp_decode_attention_f32.argtypes = [ptr] * 6 + [i64] * 5 + [ctypes.c_float, ctypes.c_int]
    lib.bp_decode_attention_f32.restype = None
    lib.bp_isa_level.restype = ctypes.c_int
    return lib


def available() -> bool:
    return _library() is not None


def kernel_name() -> str | None:
    lib = _library()
    return None if lib is None else f"batchproof-{ISA_NAMES[lib.bp_isa_level()]}"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, num_threads: int) -> torch.Tensor:
    """x: [M, K] @ w[N, K]^T (+ b[N]) -> [M, N]; each output summed in a fixed order."""
    lib = _library()
    assert lib is not None and x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and w.is_contiguous() and (b is None or b.is_contiguous())
    y = torch.empty(m, n, dtype=torch.float32)
    lib.bp_linear_f32(_ptr(x), _ptr(w), _ptr(b), _ptr(y), m, n, k, num_threads)
    return y


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scale: float, num_threads: int) -> torch.Tensor:
    """q: [B, H, D]; k_cache, v_cache: [slots, KVH, max_len, D] of one layer -> [B, H, D]."""
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
        b, h, kvh, d, max_len, scale, num_threads,
    )
    return out
