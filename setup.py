"""Builds the batch-invariant CPU kernels; everything else is in pyproject.toml."""

import platform

from setuptools import Extension, setup

# -ffp-contract=off: the portable path must not get FMAs in some places and not others.
# The vector paths are selected at run time (target attributes), so no -march is needed.
compile_args = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
if platform.system() == "Darwin":
    compile_args.remove("-fopenmp")

setup(
    ext_modules=[
        Extension(
            "batchproof.engine.model.ops._kernels",
            sources=["src/batchproof/engine/model/ops/kernels.c", "src/batchproof/engine/model/ops/quant.c",
                     "src/batchproof/engine/model/ops/layers.c"],
            depends=["src/batchproof/engine/model/ops/kernels.h"],
            extra_compile_args=compile_args,
            extra_link_args=["-fopenmp"] if "-fopenmp" in compile_args else [],
            optional=True,  # without a compiler the engine falls back to padded torch matmuls
        )
    ]
)
