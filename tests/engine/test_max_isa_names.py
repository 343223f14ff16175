"""--max-isa's names: the CLI offers exactly the levels the kernels know (neon too), a name it
does not know is refused naming the field, and each name is a cap by level number on either
architecture (neon on x86 runs AVX2, as avx2 on ARM runs NEON): never a demand."""

import argparse

import pytest
import torch

from batchproof.commands.flags import add_dataclass_arguments
from batchproof.common.config import ConfigError
from batchproof.engine.config import EngineConfig
from batchproof.engine.model.ops import choose_ops, kernels


def test_the_flag_offers_the_kernels_levels_and_auto():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, EngineConfig)
    assert parser.parse_args(["--max-isa", "neon"]).max_isa == "neon"
    choices = next(a.choices for a in parser._actions if a.dest == "max_isa")
    assert set(choices) == {"auto", *kernels.ISA_LEVELS}
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-isa", "sse4"])


def test_an_unknown_level_is_refused_by_name():
    with pytest.raises(ConfigError, match="max_isa must be one of auto, avx512, avx2, neon, portable, got 'sse4'"):
        EngineConfig(max_isa="sse4")


@pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")
def test_neon_caps_at_each_architectures_first_vector_level():
    """Level 1 is AVX2 on x86 and NEON on aarch64 (the CPU's best where it has less): the kernel name says which ran."""
    kernels.cap_isa_level(2)
    detected = kernels.isa_level()
    try:
        ops = choose_ops(torch.device("cpu"), torch.float32, True, 1, max_isa="neon")
        assert kernels.isa_level() == min(1, detected)
        assert ops.decode_path.startswith(f"batchproof-{kernels.ISA_NAMES[min(1, detected)]} ")
    finally:
        kernels.cap_isa_level(2)
