"""The packaged models' own contracts: each loads, blesses its model's file (name and sha256),
and asks what the default contract asks in every other clause."""

import dataclasses

import pytest

from batchproof.check.contract import SHIPPED_FOR_MODEL, contract_from_text, load_contract, shipped_contract_text
from batchproof.engine.model.known_models import KNOWN_MODELS


@pytest.mark.parametrize("model", sorted(SHIPPED_FOR_MODEL))
def test_a_models_contract_blesses_its_file_and_keeps_every_other_clause(model: str) -> None:
    assert model in KNOWN_MODELS
    contract = contract_from_text(shipped_contract_text(SHIPPED_FOR_MODEL[model]))
    (blessed,) = contract.blessed_models
    assert blessed.sha256 and len(blessed.sha256) == 64
    default = load_contract()
    assert dataclasses.replace(contract, blessed_models=default.blessed_models) == default


def test_gemmas_contract_names_the_packaged_file() -> None:
    contract = contract_from_text(shipped_contract_text(SHIPPED_FOR_MODEL["gemma3-270m"]))
    assert contract.blessed_models[0].prefix == "gemma-3-270m-q4_k_m"
    assert contract.blessed_models[0].sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
