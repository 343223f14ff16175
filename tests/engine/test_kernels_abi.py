"""The kernels' C interface is declared once, in kernels.h, and everything else is held to
it: abi.py's ctypes signatures (every function, restype and argtypes) are the header's
prototypes, kernels.py calls only declared functions, the library exports exactly those,
the struct mirrors have the header's fields and the compiled layout, and the block table
has gguf's sizes. A prototype or field changed on one side only fails here (or at load)."""

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchproof.engine.model.ops import abi, kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

OPS = Path(abi.__file__).parent
CSRC = OPS / "csrc"  # the C sources
SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "double": ctypes.c_double,
           "void": None}
PROTOTYPE = re.compile(r"^((?:const\s+)?\w+[\s*]+?)(bp_\w+)\(([^)]*)\);", re.M)
STRUCT = re.compile(r"typedef struct \{(.*?)\} (bp_\w+);", re.S)


def header() -> str:
    """kernels.h without its comments."""
    return re.sub(r"/\*.*?\*/", "", (CSRC / "kernels.h").read_text(), flags=re.S)


def c_type(declaration: str):
    """A C type (or parameter, "const float *x") as abi.py gives it to ctypes: a char
    pointer is a string, any other pointer an address."""
    words = [w for w in declaration.replace("*", " * ").split() if w != "const"]
    if "*" in words:
        return ctypes.c_char_p if words[0] == "char" else ctypes.c_void_p
    return SCALARS[words[0]]


def prototypes() -> dict[str, tuple]:
    """name: (restype, argtypes) for every function kernels.h declares."""
    found = {}
    for match in PROTOTYPE.finditer(header()):
        returns, name, params = match.groups()
        params = [p.strip() for p in params.split(",")]
        found[name] = (c_type(returns), [] if params == ["void"] else [c_type(p) for p in params])
    return found


def struct_fields() -> dict[str, list[str]]:
    """name: field names in order, for every struct kernels.h defines."""
    found = {}
    for body, name in STRUCT.findall(header()):
        declarators = [part for decl in body.split(";") if decl.strip() for part in decl.split(",")]
        found[name] = [re.findall(r"\w+", re.sub(r"\[.*?\]", "", d))[-1] for d in declarators]
    return found


def type_name(t) -> str:
    return "void" if t is None else t.__name__


def describe(signature: tuple) -> str:
    restype, argtypes = signature
    return f"{type_name(restype)}({', '.join(type_name(t) for t in argtypes)})"


def test_the_header_parses_into_every_exported_function():
    declared = prototypes()  # the parser's own edge cases: (void), a returned string, a pointer parameter
    assert len(declared) >= 20 and declared["bp_isa_level"] == (ctypes.c_int, [])
    assert declared["bp_numerics_version"] == (ctypes.c_char_p, []) and declared["bp_abi_field"][0] == ctypes.c_char_p
    assert declared["bp_first_max_f32"] == (None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p])


def test_abi_py_declares_every_function_as_the_header_does():
    declared, bound = prototypes(), abi.SIGNATURES
    assert set(bound) - set(declared) == set(), "bound in abi.py but not declared in kernels.h"
    assert set(declared) - set(bound) == set(), "declared in kernels.h but not bound in abi.py"
    wrong = {name: f"kernels.h {describe(declared[name])}, abi.py {describe(bound[name])}"
             for name in declared if tuple(declared[name]) != (bound[name][0], list(bound[name][1]))}
    assert wrong == {}


def test_the_loaded_functions_carry_those_signatures():
    lib = kernels._library()
    for name, (restype, argtypes) in prototypes().items():
        function = getattr(lib, name)
        assert function.restype == restype and list(function.argtypes) == argtypes, name
    used = {name for name, value in vars(lib).items() if isinstance(value, ctypes._CFuncPtr)}
    assert used <= set(prototypes()), "called but not declared"


def test_kernels_py_calls_only_declared_functions():
    called = set(re.findall(r"\.(bp_\w+)\(", (OPS / "kernels.py").read_text()))
    assert called and called <= set(prototypes())


def test_the_library_exports_exactly_the_declared_functions():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm here")
    symbols = subprocess.run([nm, "-D", "--defined-only", kernels._library()._name], capture_output=True, text=True,
                             check=True).stdout.split()
    exported = {s for s in symbols if s.startswith("bp_")}
    assert exported == set(prototypes())


def test_the_struct_mirrors_have_the_header_s_fields_and_the_compiled_layout():
    assert struct_fields() == {name: [f for f, _ in mirror._fields_] for name, mirror in abi.STRUCTS.items()}
    abi.check_abi(kernels._library())


class SwappedShape(ctypes.Structure):
    _fields_ = [(name, kind) for name, kind in abi.Shape._fields_ if name not in ("eps", "scale")]
    _fields_[9:9] = [("scale", ctypes.c_float), ("eps", ctypes.c_float)]


class LongerWeight(ctypes.Structure):
    _fields_ = [*abi.Weight._fields_, ("spare", ctypes.c_int64)]


@pytest.mark.parametrize(("c_name", "mirror", "message"), [
    ("bp_shape", SwappedShape, "field 9 is 'scale' at offset 64 in Python, 'eps' at offset 64 in C"),
    ("bp_weight", LongerWeight, "field 5 is 'spare' at offset 120 in Python, None at offset -1 in C"),
])
def test_a_mirror_changed_on_one_side_fails_the_load_time_check(c_name, mirror, message):
    structs = {**abi.STRUCTS, c_name: mirror}
    with pytest.raises(abi.ABIMismatch, match=rf"{mirror.__name__} does not match kernels.h's {c_name}: "
                                              rf"{re.escape(message)}"):
        abi.check_abi(kernels._library(), structs)


def test_the_block_table_has_gguf_s_sizes():
    native = {t for t in GGMLQuantizationType if kernels.runs_natively(int(t))}
    Q = GGMLQuantizationType
    assert native == {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
    for t in GGMLQuantizationType:
        assert kernels.block_size(int(t)) == (GGML_QUANT_SIZES[t] if t in native else (0, 0)), t.name
