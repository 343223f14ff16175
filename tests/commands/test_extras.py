"""What a verb that needs an extra finds missing, read from Requires-Dist lines as pip writes
them: an extra's own packages, those of an extra it names through our own package, and the line
a user sees instead of a traceback."""

import tomllib
from pathlib import Path

from batchproof.cli import COMMANDS
from batchproof.commands.extras import install_hint, missing_from

REQUIRES = [
    "httpx>=0.27",
    "pyyaml>=6.0",
    'torch>=2.4; extra == "serve"',
    'prometheus-client>=0.20; extra == "serve"',
    "batchproof[serve]; extra == 'fleet'",
    'ray[serve]>=2.50; extra == "fleet"',
    'pytest>=8; extra == "test"',
]
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_an_extra_lists_only_its_own_packages_that_are_absent() -> None:
    assert missing_from(REQUIRES, "serve", lambda name: False) == ["torch", "prometheus-client"]
    assert missing_from(REQUIRES, "serve", lambda name: name == "torch") == ["prometheus-client"]
    assert missing_from(REQUIRES, "serve", lambda name: True) == []
    assert missing_from(REQUIRES, "nothing-such", lambda name: False) == []


def test_an_extra_that_names_our_package_brings_that_extra_too() -> None:
    assert missing_from(REQUIRES, "fleet", lambda name: False) == ["ray", "torch", "prometheus-client"]
    assert missing_from(REQUIRES, "fleet", lambda name: name != "ray") == ["ray"]


def test_the_hint_is_one_line_naming_the_extra_and_the_command_to_install_it() -> None:
    hint = install_hint("serve", "serve", ["torch", "numpy", "gguf", "tokenizers", "safetensors", "jinja2"])
    assert "\n" not in hint
    assert hint == ("batchproof serve: needs the 'serve' extra, which this install lacks (torch, numpy, gguf, "
                    "tokenizers and 2 more not installed): pip install 'batchproof[serve]' (from a checkout: "
                    "pip install -e '.[serve]')")


def test_every_extra_a_verb_names_is_declared_and_the_light_verbs_need_none() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {verb.extra for verb in COMMANDS.values()} - {None} <= set(declared)
    light = [name for name, verb in COMMANDS.items() if verb.extra is None]
    assert light == ["models", "probe", "check", "report", "board"]
    # The fleet's replicas are engines: its extra brings the server's.
    assert "batchproof[serve]" in declared["fleet"]
