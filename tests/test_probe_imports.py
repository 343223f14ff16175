"""The probe never imports torch or numpy, so it starts at once on a machine without them."""

import pkgutil
import subprocess
import sys

import batchproof


def test_the_probe_modules_import_neither_torch_nor_numpy() -> None:
    found = pkgutil.iter_modules(batchproof.__path__)
    modules = sorted(f"batchproof.{m.name}" for m in found if m.name.startswith("probe"))
    assert "batchproof.probe" in modules and len(modules) > 3
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
