"""Builds the batch-invariant CPU kernels; everything else is in pyproject.toml.

The light install (no extras) builds them too: they need Python's headers, not torch, and a later
`pip install 'batchproof[serve]'` only adds packages, so the server it brings finds them."""

import platform

from setuptools import Extension, setup

# -ffp-contract=off: the portable path must not get FMAs in some places and not others.
# The vector paths are selected at run time (target attributes), so no -march is needed.
compile_args = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
if platform.system() == "Darwin":
    compile_args.remove("-fopenmp")
# The C files, in ops/csrc/, one family of kernels each (a kernel's twin per instruction set in a
# file of its own, name_avx2.c); kernels.h declares them all. The module is built next to ops/'s
# Python files, which load it.
CSRC = "src/batchproof/engine/model/ops/csrc"

setup(
    ext_modules=[
        Extension(
            "batchproof.engine.model.ops._kernels",
            sources=[f"{CSRC}/{name}.c" for name in ("isa", "matmul", "elementwise", "logprobs", "attention",
                                                      "attention_group", "peak", "quant_dequant",
                                                      "quant_dequant_avx2", "quant_tiles_pick", "quant_tiles_avx2",
                                                      "quant_tiles_avx512", "quant_tiles_neon", "quant_linear",
                                                      "quant_int8", "quant_int8_avx2", "quant_int8_avx512",
                                                      "quant_int8_neon", "quant_int8_linear", "layers", "moe", "sample",
                                                      "module")],
            depends=[f"{CSRC}/{name}.h" for name in ("kernels", "lanes", "exp_poly", "softmax", "attention_group",
                                                      "quant", "quant_tiles_body", "quant_int8", "fixed_math", "layers")],
            extra_compile_args=compile_args,
            extra_link_args=["-fopenmp"] if "-fopenmp" in compile_args else [],
            optional=True,  # without a compiler the engine falls back to padded torch matmuls
        )
    ]
)
