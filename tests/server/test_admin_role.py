"""The admin key (--admin-api-key): only it may pause, resume, load weights and abort anyone's
requests; a tenant's key gets a 403 there but may abort its own requests; the admin key also
serves as a tenant of its own; --allow-weight-updates without it stops at start."""

import argparse
import json
import re
import threading

import httpx
import pytest

from batchproof.commands.serve import add_arguments, configs
from batchproof.common.config import ConfigError
from batchproof.engine.config import EngineConfig
from batchproof.engine.model.known_models import resolve_model
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig
from batchproof.server.guards.auth import server_api_keys
from tests.helpers.http import assert_error, chat_body, parse_sse, post, streamed_chat, wait_until
from tests.helpers.live_server import live_server

ADMIN, ALICE, BOB = "admin-key", "alice-key", "bob-key"
CHAT = "/v1/chat/completions"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def live(engine, tmp_path_factory):
    """Two tenants and the admin, with the control plane on (weights_root: the served model's folder)."""
    keys = tmp_path_factory.mktemp("keys") / "tenants"
    keys.write_text(f"{ALICE}\n{BOB}\n")
    with live_server(engine, allow_weight_updates=True, api_key_file=keys, admin_api_key=ADMIN) as live:
        yield live


class Stream(threading.Thread):
    """A long streamed chat completion (or other request), read as it arrives."""

    def __init__(self, url: str, key: str, path: str = CHAT, body: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.path, self.raw = url, key, path, ""
        self.body = body or chat_body("Tell me a long story.", max_tokens=1000, ignore_eos=True)
        self.start()
        assert wait_until(lambda: self.raw.count("data: ") >= 3, timeout=60)  # the first events, then tokens

    def run(self) -> None:
        with httpx.stream("POST", self.url + self.path, json={**self.body, "stream": True}, headers=_auth(self.key),
                          timeout=120) as response:
            for text in response.iter_text():
                self.raw += text

    @property
    def id(self) -> str:
        """The reply's id: the first a stream names (a chat chunk's; a Responses stream's response)."""
        return re.search(r'"id": ?"([^"]+)"', self.raw).group(1)

    def finish_reason(self) -> str | None:
        self.join(120)
        return streamed_chat(parse_sse(self.raw))[2]


def _abort(url: str, key: str, request_ids: list[str] | None = None) -> httpx.Response:
    body = None if request_ids is None else {"request_ids": request_ids}
    return httpx.post(url + "/abort_requests", json=body, headers=_auth(key), timeout=60)


def test_a_tenant_key_is_refused_the_control_plane_and_the_admin_key_is_not(live):
    model = str(resolve_model(None))  # the served file itself: a load that changes nothing
    for key, status in ((ALICE, 403), (ADMIN, 200)):
        replies = [httpx.post(live.url + "/pause", params={"mode": "keep"}, headers=_auth(key), timeout=60),
                   httpx.post(live.url + "/resume", headers=_auth(key), timeout=60),
                   httpx.post(live.url + "/v1/load_weights", json={"path": model}, headers=_auth(key), timeout=120)]
        for reply, path in zip(replies, ("/pause", "/resume", "/v1/load_weights")):
            if status == 403:
                assert_error(reply, 403, mentions=(path, "admin"))
                assert reply.json()["error"]["type"] == "permission_error"
            else:
                assert reply.status_code == 200, reply.text
    assert httpx.get(live.url + "/is_paused", headers=_auth(ALICE)).json() == {"is_paused": False, "mode": None}


def test_only_the_admin_and_the_owner_abort_a_request(live):
    alices = Stream(live.url, ALICE)
    assert_error(_abort(live.url, BOB, [alices.id]), 403, param="request_ids", mentions=("/abort_requests", "admin"))
    assert _abort(live.url, BOB).json() == {"num_aborted": 0}  # all of Bob's: he has none
    assert alices.is_alive()
    assert _abort(live.url, ALICE, [alices.id]).json() == {"num_aborted": 1}
    assert alices.finish_reason() == "abort"
    assert _abort(live.url, BOB, [alices.id]).json() == {"num_aborted": 0}  # over: no one's any more

    alices, admins = Stream(live.url, ALICE), Stream(live.url, ADMIN)  # the admin is a tenant of its own
    assert_error(_abort(live.url, ALICE, [admins.id]), 403, param="request_ids")
    assert _abort(live.url, ALICE).json() == {"num_aborted": 1}  # all of Alice's, not the admin's
    assert alices.finish_reason() == "abort" and admins.is_alive()
    assert _abort(live.url, ADMIN).json() == {"num_aborted": 1}  # the admin's: everyone's
    assert admins.finish_reason() == "abort"


def test_a_tenant_names_its_requests_as_the_engine_does(live):
    """A Responses id (resp_<hex>), and a choice's engine id (the reply's id and "-index")."""
    response = Stream(live.url, ALICE, "/v1/responses", {"input": "Tell me a long story.", "max_output_tokens": 1000})
    assert response.id.startswith("resp_")
    assert_error(_abort(live.url, BOB, [response.id]), 403, param="request_ids")
    assert _abort(live.url, ALICE, [response.id]).json() == {"num_aborted": 1}
    response.join(60)
    last = json.loads(response.raw.rstrip().rsplit("data: ", 1)[1])  # response.incomplete
    assert last["response"]["incomplete_details"] == {"reason": "abort"}
    two = Stream(live.url, ALICE, body=chat_body("Tell me a long story.", max_tokens=1000, ignore_eos=True, n=2))
    assert_error(_abort(live.url, BOB, [f"{two.id}-1"]), 403, param="request_ids")
    assert _abort(live.url, ALICE, [f"{two.id}-1"]).json() == {"num_aborted": 1}
    assert _abort(live.url, ALICE, [two.id]).json() == {"num_aborted": 1}  # the other choice
    two.join(60)
    assert not two.is_alive()


def test_an_admin_key_alone_turns_keys_on(engine):
    with live_server(engine, admin_api_key=ADMIN) as live:
        assert_error(post(live.url, CHAT, chat_body("hi", max_tokens=1)), 401, param="authorization")
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1), headers=_auth(ADMIN)).status_code == 200
        info = httpx.get(live.url + "/v1/server_info", headers=_auth(ADMIN)).json()["server"]
        assert info["api_key_required"] is True and info["prefix_cache_scope"] == "key"


def test_weight_updates_without_an_admin_key_stop_at_start(monkeypatch, capsys):
    monkeypatch.delenv("BATCHPROOF_ADMIN_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="--allow-weight-updates needs an admin API key .*--admin-api-key"):
        create_app(ServerConfig(allow_weight_updates=True, api_key="tenant"), EngineConfig(device="cpu"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert configs(parser.parse_args(["--allow-weight-updates", "--api-key", "tenant"]), "serve") is None
    assert "--allow-weight-updates needs an admin API key" in capsys.readouterr().err
    monkeypatch.setenv("BATCHPROOF_ADMIN_API_KEY", ADMIN)  # kept out of ps, as $BATCHPROOF_API_KEY
    assert server_api_keys(ServerConfig(allow_weight_updates=True)).admin_key == ADMIN


def test_an_admin_key_that_is_also_a_tenants_or_one_of_two_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="also a tenant's"):
        server_api_keys(ServerConfig(api_key=ADMIN, admin_api_key=ADMIN))
    (tmp_path / "admin").write_text(f"{ADMIN}\n{ALICE}\n")
    with pytest.raises(ConfigError, match="holds 2 keys"):
        server_api_keys(ServerConfig(admin_api_key_file=tmp_path / "admin"))
    (tmp_path / "admin").write_text(f"# the admin\n{ADMIN}\n")
    assert server_api_keys(ServerConfig(admin_api_key_file=tmp_path / "admin")).admin_key == ADMIN
