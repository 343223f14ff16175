"""transformers (and accelerate) are test tools only: no module of the server imports them, at any depth."""

import pytest

from tests.test_import_rule import MODULES, imports


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_transformers(module):
    assert not imports(module)[1] & {"transformers", "accelerate"}
