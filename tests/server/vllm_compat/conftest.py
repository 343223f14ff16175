"""vLLM's tests run as they are written (async, `@pytest.mark.asyncio`, a module `server`), with
our live server in place of theirs: no pytest-asyncio here, so each coroutine test runs in its own
event loop."""

import asyncio
import inspect

import pytest

from tests.server.vllm_compat.remote import MODEL_NAME, RemoteOpenAIServer


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "asyncio: a coroutine test (vLLM's marker), run by asyncio.run here")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


@pytest.fixture(scope="module")
def server(server) -> RemoteOpenAIServer:
    """The shared live server (tests/conftest.py), as vLLM's tests hold theirs."""
    assert server.state.served_model_name == MODEL_NAME
    return RemoteOpenAIServer(server)
