"""Builds the batch-invariant CPU kernels; everything else is in pyproject.toml."""

import platform

from setuptools import Extension, setup

# -ffp-contract=off: the portable path must not get FMAs in some places and not others.
# The vector paths are selected at run time (target attributes), so no -march is needed.
compile_args = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
if platform.system() == "Darwin":
    compile_args.remove("-fopenmp")
OPS = "src/batchproof/engine/model/ops"  # the C files, one family of kernels each; kernels.h declares them all

setup(
    ext_modules=[
        Extension(
            "batchproof.engine.model.ops._kernels",
            sources=[f"{OPS}/{name}.c" for name in ("isa", "matmul", "elementwise", "logprobs", "attention", "peak",
                                                     "quant_dequant", "quant_tiles", "quant_linear", "layers",
                                                     "module")],
            depends=[f"{OPS}/{name}.h" for name in ("kernels", "lanes", "exp_poly", "quant")],
            extra_compile_args=compile_args,
            extra_link_args=["-fopenmp"] if "-fopenmp" in compile_args else [],
            optional=True,  # without a compiler the engine falls back to padded torch matmuls
        )
    ]
)
