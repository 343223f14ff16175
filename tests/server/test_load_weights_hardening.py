"""POST /v1/load_weights reads only under --weights-root: no path, `..` or symlink out of it,
no device or FIFO; one answer for every file-system state; a file that is not a model is
never hashed and its bytes never quoted; the sha256 names the bytes loaded."""

import os
import shutil

import httpx
import pytest

from batchproof.common.config import ConfigError
from batchproof.common.hashing import file_sha256
from batchproof.engine.model import source
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf import source as gguf_source
from batchproof.engine.model.gguf.source import GGUFSource
from batchproof.engine.model.hf import checkpoint as hf_checkpoint
from batchproof.server.config import ServerConfig
from tests.helpers.http import assert_error
from tests.helpers.live_server import live_server

KEY = "weights-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NOT_LOADABLE = "not a loadable checkpoint under --weights-root"
SECRET = b"TOPSECRET: the launch codes are 0000\n" * 64


@pytest.fixture
def root(tmp_path):
    """A weights root, with a sibling outside it holding a secret."""
    inside = tmp_path / "weights"
    inside.mkdir()
    (tmp_path / "outside.gguf").write_bytes(SECRET)
    return inside


def _load(url: str, path: str) -> httpx.Response:
    return httpx.post(url + "/v1/load_weights", json={"path": path}, headers=AUTH, timeout=30)


def test_paths_outside_the_root_devices_and_fifos_are_refused_unread(engine, root, monkeypatch) -> None:
    (root / "to-outside.gguf").symlink_to(root.parent / "outside.gguf")
    (root / "to-zero.gguf").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo.gguf")
    linked = root / "ckpt"  # a checkpoint whose weights file leads out of the root
    linked.mkdir()
    (linked / "config.json").write_text("{}")
    (linked / "model.safetensors").symlink_to(root.parent / "outside.gguf")
    opened = []
    monkeypatch.setattr(engine, "prepare_weights", lambda path: opened.append(path))
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=root) as live:
        for path in ("/etc/passwd", "../outside.gguf", str(root / ".." / "outside.gguf"), "/dev/zero",
                     "to-outside.gguf", "to-zero.gguf", "fifo.gguf", "ckpt", "missing.gguf", str(root), "a\0b"):
            error = assert_error(_load(live.url, path), 400, param="path", mentions=(NOT_LOADABLE,))
            assert "TOPSECRET" not in error["message"] and "no such file" not in error["message"]
    assert opened == []  # nothing was handed to the loader


def test_a_file_that_cannot_be_opened_reads_as_one_that_is_missing(engine, root, monkeypatch) -> None:
    (root / "locked.gguf").write_bytes(SECRET)
    real_open = os.open

    def open_denied(path, *args, **kwargs):  # as chmod 000 would (this may run as root)
        if str(path).endswith("locked.gguf"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(source.os, "open", open_denied)
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=root) as live:
        denied = assert_error(_load(live.url, "locked.gguf"), 400, param="path")
        missing = assert_error(_load(live.url, "nothing.gguf"), 400, param="path")
    assert denied["message"].replace("locked", "X") == missing["message"].replace("nothing", "X")
    assert "denied" not in denied["message"].lower()


def test_a_file_that_is_not_a_model_is_never_hashed_nor_quoted(engine, root, monkeypatch) -> None:
    (root / "notes.gguf").write_bytes(SECRET)
    hashed = []
    monkeypatch.setattr(gguf_source, "file_sha256", lambda path: hashed.append(path))
    monkeypatch.setattr(hf_checkpoint, "file_sha256", lambda path: hashed.append(path))
    monkeypatch.setattr(source, "_fd_sha256", lambda fd: hashed.append(fd))
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=root) as live:
        error = assert_error(_load(live.url, "notes.gguf"), 400, param="path", mentions=("notes.gguf",))
    assert "TOPS" not in error["message"] and "b'" not in error["message"]
    assert hashed == []


def test_the_sha256_names_the_bytes_loaded(engine, root, monkeypatch) -> None:
    """A checkpoint renamed over the path while it is read is refused; otherwise the sha256 is
    that of the file read (here the served model's own bytes, copied under the root)."""
    served = root / "model.gguf"
    shutil.copyfile(engine.model_path, served)
    prepared = engine.prepare_weights(served)
    assert prepared.sha256 == file_sha256(served) == engine.model_sha256
    del prepared
    other = root / "next.gguf"
    shutil.copyfile(engine.model_path, other)
    with open(other, "r+b") as f:  # other weights: the last byte of the last tensor
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    read = GGUFSource.read

    def read_after_a_rename(self, *args):  # the trainer writes the next checkpoint over this one
        os.replace(other, served)
        return read(self, *args)

    monkeypatch.setattr(GGUFSource, "read", read_after_a_rename)
    with pytest.raises(ModelLoadError, match="changed while it was read"):
        engine.prepare_weights(served)


def test_the_root_must_be_a_directory(tmp_path) -> None:
    with pytest.raises(ConfigError, match="weights_root"):
        ServerConfig(weights_root=tmp_path / "nope")


class NoWeightUpdates:
    """A backend that runs requests and cannot replace weights (as a fleet's router): the
    running engine's every attribute but its WeightControl."""

    control = None

    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str):
        if name == "load_weights":
            raise AttributeError(name)
        return getattr(self._backend, name)


def test_a_backend_that_cannot_load_weights_is_a_501_before_the_body_is_read(engine, root, monkeypatch) -> None:
    """A Backend without a WeightControl cannot swap weights: a 501 naming why, before the body is
    parsed or a path resolved, and nothing is loaded."""
    opened = []
    monkeypatch.setattr(engine, "prepare_weights", lambda path: opened.append(path))
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=root) as live:
        served = live.state.backend
        live.state.backend = NoWeightUpdates(served)
        try:
            for body in ({"path": "model.gguf"}, {"path": ""}, {"frobnicate": 1}):
                response = httpx.post(live.url + "/v1/load_weights", json=body, headers=AUTH, timeout=30)
                assert_error(response, 501, param=None, mentions=("load_weights runs on a single engine",))
                assert response.json()["error"]["type"] == "not_implemented_error"
        finally:
            live.state.backend = served
    assert opened == []
