"""Our kernels' bits on ARM: the same digests from an aarch64 build under qemu as from x86's.

harness.c calls every kernel family (each quant type's matmul at 1 to 20 rows in both numerics,
norms, RoPE and its tables, the gated activations, attention, logprobs, the sampler, the fused
decode step) on fixed pseudo-random inputs and prints one SHA-256 per case. It is built from the
kernels' C files with setup.py's flags twice: natively, and with Debian's aarch64 cross compiler,
whose build is run under qemu-aarch64 (user mode, the cross sysroot's libraries) three times: at its
NEON level on qemu's default CPU (the register path's quantized tiles, quant_tiles_neon.c, and the
int8 numerics' dot-product tiles, quant_int8_neon.c; every other kernel is the portable C there),
on a Cortex-A53 (NEON without the dot product: the int8 tiles portable), and capped to the
portable level. Both are held to x86's portable path and to
every vector level this CPU has: every line must be equal. It does not run the engine on ARM
(bench/arm64_e2e.sh does, docs/arm.md).

Without the cross compiler or qemu the test skips, except where CI is set: CI installs them
(.ci/run), so there a missing tool fails it."""

import ast
import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.second_model import is_ci

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "src/batchproof/engine/model/ops/csrc"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
PACKAGES = "gcc-aarch64-linux-gnu libgomp1-arm64-cross qemu-user"
TIMEOUT_S = 300
ARMV80_CPU = "cortex-a53"  # qemu's model of an ARMv8.0 core: NEON, no dot product


def setup_flags() -> list[str]:
    """setup.py's compile_args, read from it, so the harness is built as the extension is."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "compile_args" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no compile_args")


def kernel_sources() -> list[Path]:
    """Every C file of the kernels but module.c (the Python module's shell, which needs Python's
    headers; the harness calls none of its functions). attention.c's one use of Python, its raw
    allocator, is include/Python.h's malloc. Largest first: the AVX-512 twins take longest to build."""
    return sorted((p for p in CSRC.glob("*.c") if p.name != "module.c"), key=lambda p: -p.stat().st_size)


def missing_tools() -> list[str]:
    missing = [tool for tool in ("gcc", CROSS_CC, QEMU) if shutil.which(tool) is None]
    if not list(SYSROOT.glob("lib/libgomp.so*")):
        missing.append(f"{SYSROOT}/lib/libgomp.so (libgomp1-arm64-cross)")
    return missing


def digests(stdout: str) -> list[tuple[str, str]]:
    """(case, digest) per line; '#' lines say which level ran and are not compared."""
    lines = [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]
    assert all(len(parts) == 2 for parts in lines), stdout[-2000:]
    return [(parts[0], parts[1]) for parts in lines]


def header(stdout: str) -> dict[str, str]:
    """The '#' lines' key-value pairs: arch, isa_level, cases."""
    pairs = {}
    for line in stdout.splitlines():
        if line.startswith("#"):
            words = line[1:].split()
            pairs.update(zip(words[::2], words[1::2], strict=False))
    return pairs


def run(args: list[str], what: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{what} failed ({done.returncode}): {' '.join(args)}\n{done.stderr[-3000:]}"
    return done.stdout


def build(pool: ThreadPoolExecutor, cc: str, out: Path) -> Path:
    """The harness and the kernels, each C file compiled on its own (in parallel), then linked."""
    flags = setup_flags()
    includes = [f"-I{HERE / 'include'}", f"-I{CSRC}"]
    out.mkdir()
    jobs = [(source, out / f"{source.stem}.o") for source in [*kernel_sources(), HERE / "harness.c"]]
    list(pool.map(lambda job: run([cc, "-c", *flags, *includes, str(job[0]), "-o", str(job[1])],
                                  f"{cc} on {job[0].name}"), jobs))
    binary = out / "harness"
    run([cc, *flags, *(str(obj) for _, obj in jobs), "-o", str(binary), "-lm"], f"{cc}: linking the harness")
    return binary


def first_difference(reference: list[tuple[str, str]], other: list[tuple[str, str]]) -> str | None:
    """None when equal; else the first case (in the harness's order) whose digest differs or is missing."""
    for i, (name, digest) in enumerate(reference):
        if i >= len(other):
            return f"{name}: missing (output stopped after {len(other)} cases)"
        if other[i] != (name, digest):
            return f"{name}: {digest} on x86's portable path, {other[i][0]} {other[i][1]} here"
    return None if len(other) == len(reference) else f"{other[len(reference)][0]}: an extra case"


def test_aarch64_under_qemu_gives_x86s_kernel_digests_at_every_level(tmp_path):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"compares an x86 host's builds with aarch64's under qemu; this host is {platform.machine()}")
    missing = missing_tools()
    if missing:
        reason = f"{', '.join(missing)} not found: apt-get install {PACKAGES}"
        if is_ci():
            pytest.fail(f"CI must run the aarch64 digests (.ci/run installs the tools): {reason}", pytrace=False)
        pytest.skip(reason)

    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        # aarch64 first (its files build in seconds): qemu runs it while the x86 twins compile.
        arm_binary = build(pool, CROSS_CC, tmp_path / "aarch64")
        # qemu's default CPU has the dot product (the int8 tiles' NEON twin); a Cortex-A53 (ARMv8.0)
        # has NEON without it, so its int8 matmuls run the portable twin's tiles.
        qemu = {(cpu, level): pool.submit(run, [QEMU, *(["-cpu", cpu] if cpu else []), "-L", str(SYSROOT),
                                                str(arm_binary), level],
                                          f"the aarch64 harness under qemu ({cpu or 'default CPU'}), level {level}")
                for cpu, level in ((None, "1"), (None, "0"), (ARMV80_CPU, "1"))}
        x86_binary = build(pool, "gcc", tmp_path / "x86_64")
        arm_out, arm_portable_out, armv80_out = (qemu[key].result() for key in qemu)

    portable_out = run([str(x86_binary), "0"], "the x86 harness at the portable level")
    best_out = run([str(x86_binary)], "the x86 harness at the CPU's level")
    best = int(header(best_out)["isa_level"])
    runs = {"aarch64 NEON under qemu": arm_out, "aarch64 portable under qemu": arm_portable_out,
            f"aarch64 NEON without the dot product (qemu -cpu {ARMV80_CPU})": armv80_out,
            f"x86 at this CPU's level ({best})": best_out}
    # every level between; at AVX-512 also the one-row pairs tile forced each way, and VNNI off
    settings = {f"x86 level {level}": [str(level)] for level in range(1, best)}
    if best >= 2:
        settings |= {"x86 AVX-512, pairs on": ["2", "1"], "x86 AVX-512, pairs off": ["2", "0"],
                     "x86 AVX-512 without VNNI": ["2", "-1", "0"]}
    runs |= {label: run([str(x86_binary), *args], f"the x86 harness, {label}") for label, args in settings.items()}

    assert header(arm_out)["arch"] == "aarch64" and header(portable_out)["isa_level"] == "0"
    assert header(arm_out)["isa_level"] == "1" and header(arm_portable_out)["isa_level"] == "0"  # NEON, then capped
    assert header(arm_out)["dotprod"] == "1" and header(armv80_out)["dotprod"] == "0"  # sdot's twin ran, then not
    reference = digests(portable_out)
    assert len(reference) == int(header(portable_out)["cases"]) + 1  # + the numerics version's line
    families = {name.split("/")[0] for name, _ in reference}
    assert {"linear_q", "linear_q_int8", "sample", "rope_tables", "decode_layers"} <= families, families
    # exp's bits as test_exp_digest records them for this numerics version (the same SHA-256 of the same inputs)
    from tests.engine.test_exp_digest import EXP_DIGESTS

    version = dict(reference)["numerics_version"]
    assert dict(reference)["exp_dense/silu+gelu"] == EXP_DIGESTS.get(version), f"exp's digest under {version}"
    differing = {label: first_difference(reference, digests(out)) for label, out in runs.items()}
    differing = {label: diff for label, diff in differing.items() if diff}
    assert not differing, f"kernel digests differ from x86's portable path ({len(reference)} cases): {differing}"
