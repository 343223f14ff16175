"""Which chat template a model gets: --chat-template, the file's own, a built-in format chosen
by the special tokens it needs, or none (and then the reason, never a guessed format)."""

from pathlib import Path

import pytest

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.front import read_chat_template
from batchproof.engine.text.chat_formats import BUILTIN_FORMATS, choose_chat_template

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
GEMMA_TOKENS = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"}
LLAMA3_TOKENS = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
CHATML_TOKENS = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}


def test_gemma_tokens_choose_gemmas_format_as_google_writes_it() -> None:
    template, origin = choose_chat_template(None, GEMMA_TOKENS, "<bos>", "<eos>")
    assert "Gemma" in origin
    assert template.render(MESSAGES) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def test_llama3_and_chatml_tokens_choose_their_formats() -> None:
    template, origin = choose_chat_template(None, LLAMA3_TOKENS, "<|begin_of_text|>", "<|eot_id|>")
    assert "Llama 3" in origin
    assert template.render(MESSAGES[1:2]) == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi"
                                              "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    template, origin = choose_chat_template(None, CHATML_TOKENS, "", "<|im_end|>")
    assert "ChatML" in origin
    assert template.render(MESSAGES[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_the_files_template_and_then_the_flag_win(tmp_path: Path) -> None:
    own = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    template, origin = choose_chat_template(own, GEMMA_TOKENS, "<bos>", "<eos>")
    assert origin == "the model file" and template.render(MESSAGES[1:2]) == "[Hi]"
    flag = tmp_path / "mine.jinja"
    flag.write_text("{{ messages[0]['content'] | upper }}")
    template, origin = choose_chat_template(own, GEMMA_TOKENS, "<bos>", "<eos>", override=read_chat_template(flag))
    assert str(flag) in origin and template.render(MESSAGES[1:2]) == "HI"
    with pytest.raises(ModelLoadError, match="missing.jinja"):
        read_chat_template(tmp_path / "missing.jinja")


@pytest.mark.parametrize("tokens", [set(), {"<s>", "</s>", "<unk>"}, {"<start_of_turn>"}, {"<|im_start|>"}])
def test_no_template_and_no_matching_tokens_is_no_template_with_the_reason(tokens: set[str]) -> None:
    template, reason = choose_chat_template(None, tokens, "<s>", "</s>")
    assert template is None
    assert "no chat template" in reason and "--chat-template" in reason and "/v1/completions" in reason
    assert all(f.name in reason for f in BUILTIN_FORMATS)
