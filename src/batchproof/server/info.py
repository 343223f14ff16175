"""What `/v1/server_info` reports: the build, the host and every setting that shapes the numbers."""

import hashlib
import socket
import subprocess
from functools import cache
from pathlib import Path

import batchproof
from batchproof.engine.text.tokenizer import Tokenizer

PACKAGE_DIR = Path(batchproof.__file__).resolve().parent
BUILD_SUFFIXES = {".py", ".c", ".yaml", ".so"}
SOURCE_SUFFIXES = {".py", ".c", ".h"}  # what a build compiles from; a host's own .so bytes differ


def _package_sha256(suffixes: set[str]) -> str:
    """sha256 over the installed package's files of these kinds (name and bytes, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in PACKAGE_DIR.rglob("*") if p.suffix in suffixes and p.is_file()):
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def build_sha256() -> str:
    return _package_sha256(BUILD_SUFFIXES)


@cache
def source_sha256() -> str:
    return _package_sha256(SOURCE_SUFFIXES)


def numerics_id(engine_info: dict) -> str:
    """A hash of what determines the bits: the model, the weights mode, the dtype, the arithmetic
    (our kernels' numerics version, the same on every instruction set; or torch's build and
    device) and the source it was built from. Two servers with the same id must answer a greedy
    request identically; the compiled library is left out, since each host builds its own."""
    parts = [engine_info["model_sha256"], engine_info["weights"], engine_info["dtype"], engine_info["numerics"],
             source_sha256()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@cache
def git_commit() -> str | None:
    """The source checkout's commit, when the package runs from one (editable install)."""
    try:
        result = subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def server_info(engine_info: dict, served_model_name: str, server_settings: dict) -> dict:
    return {
        "name": "batchproof",
        "version": batchproof.__version__,
        "build_sha256": build_sha256(),
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "served_model_name": served_model_name,
        "numerics_id": numerics_id(engine_info),
        **engine_info,
        "server": server_settings,
    }


def tokenizer_facts(tokenizer: Tokenizer, chat_template: str | None, max_model_len: int) -> dict:
    """The special tokens (spelling and id), the context length and the chat template."""
    ids = tokenizer.ids

    def spelling(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.spelling(token_id)

    return {
        "tokenizer_class": "ByteLevelBPE (GGUF)",
        "bos_token": spelling(ids.bos_id), "bos_token_id": ids.bos_id,
        "eos_token": spelling(ids.eos_id), "eos_token_id": ids.eos_id,
        "pad_token": spelling(ids.pad_id), "pad_token_id": ids.pad_id,
        "add_bos_token": ids.add_bos,
        "end_of_turn_token_ids": sorted(ids.end_of_turn_ids),
        "vocab_size": tokenizer.vocab_size,
        "model_max_length": max_model_len,
        "chat_template": chat_template,
    }
