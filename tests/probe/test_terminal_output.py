"""What the probe prints quotes the server (its error messages, model name, replica ids): a hostile
server's control characters are shown as escapes, never sent to the user's terminal."""

from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from batchproof.common.printable import MAX_CHARS, printable
from tests.helpers.scripted_server import Script, ScriptedServer, run_probe

# Clear the screen, forge a verdict line after a carriage return, retitle the window (OSC), ring
# the bell, reverse the rest of the line (a bidi override), and a one-byte CSI (C1).
HOSTILE = "boom\x1b[2J\r\nbatchproof probe: PASS\x1b]0;owned\x07\u202etxt.exe\x9b31m"
CONTROLS = "\x1b\r\n\x07\u202e\x9b"


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable(HOSTILE) == ("boom\\x1b[2J\\x0d\\x0abatchproof probe: PASS\\x1b]0;owned\\x07"
                                  "\\u202etxt.exe\\x9b31m")
    text = "naïve café, 東京, 👩\u200d💻, tab-free"  # letters, CJK and an emoji joined by ZWJ stay as they are
    assert printable(text) == text


def test_printable_cuts_a_flood_and_says_so() -> None:
    shown = printable("x" * (MAX_CHARS + 5000))
    assert shown == "x" * MAX_CHARS + "... (5000 more characters)"
    assert printable("\x1b" * 10, max_chars=4) == "\\x1b" * 4 + "... (6 more characters)"


def _hostile_server() -> ScriptedServer:
    """The scripted server, but every completion is refused with HOSTILE as the error message."""
    server = ScriptedServer(Script())

    async def refuse(request: Request) -> Response:
        return JSONResponse({"error": {"message": HOSTILE, "type": "server_error"}}, status_code=500)

    server.app.router.routes[:0] = [Route(path, refuse, methods=["POST"])
                                    for path in ("/v1/chat/completions", "/v1/completions")]
    return server


def test_a_servers_error_message_reaches_the_terminal_inert(tmp_path: Path, capsys) -> None:
    with _hostile_server() as server:
        code, witness = run_probe(server.url, tmp_path)
    captured = capsys.readouterr()
    assert code == 8 and witness is not None
    assert HOSTILE in witness["reference"]["reason"], "the witness keeps what the server said"
    printed = captured.out + captured.err
    assert "\\x1b[2J\\x0d\\x0abatchproof probe: PASS\\x1b]0;owned" in printed, "shown, as escapes"
    assert not set(CONTROLS) & set(printed.replace("\n", "")), "no control character but our own newlines"
    assert all(line.startswith(("probe: ", "batchproof probe: ", "  ", "witness: ")) for line in printed.splitlines())
