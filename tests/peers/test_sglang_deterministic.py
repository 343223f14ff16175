"""SGLang's own determinism test (`sglang/test/test_deterministic.py`, as its wheel ships it) against
our server, through the shim from its `/generate` to our completions: a short run of its `single`
and `prefix` modes, which must find one text per prompt and, in prefix mode, identical logprobs.

The file is loaded by path from an installed sglang distribution (`pip install --no-deps sglang`),
never copied here; `import sglang` itself needs SGLang's own dependencies, so the package's
`__init__` is not run: `sglang` and `sglang.test` are stood in for by bare packages over the
installed folders, and the test file's one import of ours (`sglang.profiler`) needs only requests.
Skipped where sglang is not installed (its 39 MB wheel is not in the test extra)."""

import importlib.util
import random
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from tests.peers.sglang_shim import SglangShim


@pytest.fixture(scope="module")
def sglang_test(tmp_path_factory) -> types.ModuleType:
    try:
        distribution = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed (pip install --no-deps sglang): its determinism test ships in the wheel")
    path = Path(str(distribution.locate_file("sglang/test/test_deterministic.py")))
    if not path.is_file():
        pytest.skip(f"sglang {distribution.version} ships no sglang/test/test_deterministic.py")
    saved = {name: sys.modules.get(name) for name in ("sglang", "sglang.test", "sglang.profiler")}
    for name, folder in (("sglang", path.parent.parent), ("sglang.test", path.parent)):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    try:
        spec = importlib.util.spec_from_file_location("sglang.test.test_deterministic", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, module_before in saved.items():
            if module_before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module_before
    return module


@pytest.fixture(scope="module")
def shim(server):
    with SglangShim(server.url) as running:
        yield running


def bench_args(sglang_test: types.ModuleType, shim: SglangShim, **settings) -> object:
    return sglang_test.BenchArgs(host="127.0.0.1", port=shim.port, **settings)


def test_single_mode_gives_one_text_over_batches_of_1_to_4(sglang_test, shim, capsys) -> None:
    args = bench_args(sglang_test, shim, test_mode="single", n_trials=4, max_new_tokens=12)
    assert sglang_test.test_deterministic(args) == [1]
    assert "Total samples: 4, Unique samples: 1" in capsys.readouterr().out


def test_prefix_mode_gives_one_text_and_identical_logprobs_per_prefix(sglang_test, shim, capsys) -> None:
    random.seed(3)  # which prefixes the script samples into its batches: some prefix twice or more
    args = bench_args(sglang_test, shim, test_mode="prefix", n_start=1, n_trials=3, max_new_tokens=6,
                      return_logprob=True)
    assert all(unique <= 1 for unique in sglang_test.test_deterministic(args))
    out = capsys.readouterr().out
    assert "samples have identical logprobs" in out  # at least one prefix compared across batches
    assert "Logprobs are identical across all batch sizes!" in out and "mismatches" not in out
