"""`batchproof fleet`'s refusals, before anything starts: bad settings, and Ray missing (the
fleet is an optional extra; the single server never needs it)."""

import subprocess
import sys

from batchproof.cli import main

BLOCK_RAY = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'ray':\n"
    "            raise ImportError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "from batchproof.cli import main\n"
    "sys.exit(main(['fleet', '--replicas', '2']))\n"
)


def test_bad_settings_are_refused_with_their_name(capsys) -> None:
    assert main(["fleet", "--replicas", "0"]) == 2
    assert "batchproof fleet: replicas must be >= 1, got 0" in capsys.readouterr().err
    assert main(["fleet", "--threads-per-replica", "0"]) == 2
    assert "threads_per_replica must be >= 1, got 0" in capsys.readouterr().err


def test_without_ray_it_says_what_to_install() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCK_RAY], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "batchproof fleet: Ray Serve is not installed: pip install -e '.[fleet]' " \
                                    "(or pip install 'ray[serve]')"
