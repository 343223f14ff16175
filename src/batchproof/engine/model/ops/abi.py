"""The compiled kernels' C interface as kernels.h declares it: each function's ctypes
signature, and mirrors of the structs the fused decode step reads, checked against the
layout the library reports (bp_abi_*) at every load, so that a change on one side only
fails at load instead of passing arguments or weights the wrong way."""

import ctypes
import importlib.util
from ctypes import c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_void_p
from functools import cache

# name: (restype, argtypes), for every function kernels.h declares (tests/engine/
# test_kernels_abi.py holds the two to each other). Pointers are c_void_p: the callers
# pass tensors' and arrays' addresses.
SIGNATURES = {
    "bp_isa_level": (c_int, []),
    "bp_cap_isa_level": (None, [c_int]),
    "bp_allow_vnni": (None, [c_int]),
    "bp_prefer_pairs": (None, [c_int]),
    "bp_numerics_version": (c_char_p, []),
    "bp_linear_f32": (None, [c_void_p] * 4 + [c_int64] * 3 + [c_int, c_int]),
    "bp_linear_q": (None, [c_void_p, c_void_p, c_int, c_int64, c_void_p, c_void_p] + [c_int64] * 4 + [c_int, c_int]),
    "bp_linear_q_int8": (None, [c_void_p, c_void_p, c_int, c_int64, c_void_p, c_void_p] + [c_int64] * 4
                         + [c_int, c_int]),
    "bp_int8_packed_bytes": (c_int64, [c_int, c_int64, c_int64]),
    "bp_int8_repack": (None, [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p]),
    "bp_int8_dequant_rows": (None, [c_void_p, c_int, c_int64, c_void_p, c_int64, c_void_p]),
    "bp_dequant_rows": (None, [c_void_p, c_int, c_int64, c_int64, c_void_p, c_int64, c_void_p]),
    "bp_block_bytes": (c_int64, [c_int]),
    "bp_block_elems": (c_int64, [c_int]),
    "bp_rms_norm_f32": (None, [c_void_p] * 3 + [c_int64] * 2 + [c_float]),
    "bp_rope_f32": (None, [c_void_p] + [c_int64] * 5 + [c_void_p] * 3 + [c_int]),
    "bp_silu_mul_f32": (None, [c_void_p] * 2 + [c_int64] * 2 + [c_int]),
    "bp_gelu_tanh_mul_f32": (None, [c_void_p] * 2 + [c_int64] * 2 + [c_int]),
    "bp_first_max_f32": (None, [c_void_p] + [c_int64] * 2 + [c_void_p]),
    "bp_top_k_logprobs_f32": (None, [c_void_p] + [c_int64] * 3 + [c_void_p] * 5),
    "bp_tail_logprobs_f32": (c_int, [c_void_p] + [c_int64] * 2 + [c_void_p] * 3 + [c_int64] + [c_void_p] * 2),
    "bp_sample_f32": (c_int64, [c_void_p, c_int64, c_float, c_int64, c_double, c_double, c_double, c_void_p]),
    "bp_rope_tables": (None, [c_int64, c_double, c_int64, c_void_p, c_float, c_void_p, c_void_p]),
    "bp_decode_attention_f32": (None, [c_void_p] * 6 + [c_int64] * 6 + [c_float, c_int]),
    "bp_prompt_attention_f32": (None, [c_void_p] * 4 + [c_int64] * 8 + [c_float, c_int]),
    "bp_decode_layers": (None, [c_void_p] * 2 + [c_int64, c_void_p, c_int64] + [c_void_p] * 3 + [c_int]),
    "bp_fma_peak": (c_double, [c_double, c_int]),
    "bp_int_dot_peak": (c_double, [c_double, c_int]),
    "bp_read_bandwidth": (c_double, [c_int64, c_int, c_int]),
    "bp_abi_sizeof": (c_int64, [c_int]),
    "bp_abi_field": (c_char_p, [c_int, c_int]),
    "bp_abi_offset": (c_int64, [c_int, c_int]),
}

MAX_PARTS = 4  # BP_MAX_PARTS


class Weight(ctypes.Structure):
    """bp_weight: a matmul weight of up to MAX_PARTS tensors side by side."""

    _fields_ = [("num_parts", c_int32), ("types", c_int32 * MAX_PARTS), ("data", c_void_p * MAX_PARTS),
                ("rows", c_int64 * MAX_PARTS), ("row_bytes", c_int64 * MAX_PARTS)]


class Layer(ctypes.Structure):
    """bp_layer: one layer's weights, norms (None where the model has none), RoPE tables,
    sliding window, its slice of the KV cache and, in a routed layer, its experts (a Moe's address)."""

    _fields_ = [("attn_norm", c_void_p), ("ffn_norm", c_void_p), ("bqkv", c_void_p), ("q_norm", c_void_p),
                ("k_norm", c_void_p), ("post_attn_norm", c_void_p), ("post_ffn_norm", c_void_p),
                ("wqkv", Weight), ("wo", Weight), ("w_gate_up", Weight), ("w_down", Weight),
                ("cos_table", c_void_p), ("sin_table", c_void_p), ("window", c_int64), ("k_cache", c_void_p),
                ("v_cache", c_void_p), ("q_norm_full", c_void_p), ("k_norm_full", c_void_p), ("moe", c_void_p)]


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # BP_ACT_*


class Shape(ctypes.Structure):
    """bp_shape: the model's sizes, RoPE style, MLP activation and scalars."""

    _fields_ = [("dim", c_int64), ("ffn_dim", c_int64), ("num_heads", c_int64), ("num_kv_heads", c_int64),
                ("head_dim", c_int64), ("rope_dim", c_int64), ("max_len", c_int64), ("rope_style", c_int32),
                ("mlp_act", c_int32), ("eps", c_float), ("scale", c_float), ("numerics", c_int32)]


class Moe(ctypes.Structure):
    """bp_moe: an MoE layer's float32 router, its experts' weights (arrays of Weight), the
    experts used per token, one expert's ffn size and whether the kept weights are rescaled."""

    _fields_ = [("router", Weight), ("gate_up", c_void_p), ("down", c_void_p), ("num_experts", c_int64),
                ("num_used", c_int64), ("ffn", c_int64), ("topk_normalised", c_int32)]


# The C struct each mirrors, in the order of kernels.h's BP_ABI_* ids.
STRUCTS = {"bp_weight": Weight, "bp_layer": Layer, "bp_shape": Shape, "bp_moe": Moe}


class ABIMismatch(RuntimeError):
    """The library and these declarations disagree: it was built from other sources."""


def check_abi(lib: ctypes.CDLL, structs: dict[str, type[ctypes.Structure]] = STRUCTS) -> None:
    """Each mirror's fields (names, offsets, count) and size are the C struct's, as compiled."""
    for which, (c_name, mirror) in enumerate(structs.items()):
        where = f"abi.py's {mirror.__name__} does not match kernels.h's {c_name}"
        for i, name in enumerate([name for name, _ in mirror._fields_] + [None]):  # None: past the last
            c_field = lib.bp_abi_field(which, i)
            c_field = None if c_field is None else c_field.decode()
            offset = None if name is None else getattr(mirror, name).offset
            c_offset = lib.bp_abi_offset(which, i)
            if (name, offset) != (c_field, None if c_field is None else c_offset):
                raise ABIMismatch(f"{where}: field {i} is {name!r} at offset {offset} in Python, "
                                  f"{c_field!r} at offset {c_offset} in C")
        if ctypes.sizeof(mirror) != lib.bp_abi_sizeof(which):
            raise ABIMismatch(f"{where}: {ctypes.sizeof(mirror)} bytes in Python, {lib.bp_abi_sizeof(which)} in C")


@cache
def load_library() -> ctypes.CDLL | None:
    """The built kernels with every signature declared and the structs checked; None when
    the extension was not built (no compiler: the engine then runs padded torch)."""
    spec = importlib.util.find_spec("batchproof.engine.model.ops._kernels")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise ABIMismatch(f"{spec.origin} has no {name}: it was built from other sources; rebuild it") from None
        function.restype, function.argtypes = restype, argtypes
    check_abi(lib)
    return lib
