"""Built-in chat templates for files that carry none, each chosen only by the special tokens it
needs: a model whose vocabulary spells none of them gets no chat route, never a guessed format."""

from dataclasses import dataclass

from batchproof.engine.text.chat_template import ChatTemplate

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's own template (Gemma 2 and 3): the assistant is "model", a system message opens the
# first user turn, the roles alternate.
GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


class NoChatTemplate(ValueError):
    """A chat request to a model without a chat template (the message says what to do instead)."""


@dataclass(frozen=True)
class ChatFormat:
    name: str
    source: str
    needs: tuple[str, ...]  # the special tokens the format is spelled in


BUILTIN_FORMATS = (
    ChatFormat("Gemma", GEMMA, ("<start_of_turn>", "<end_of_turn>")),
    ChatFormat("Llama 3", LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ChatFormat("ChatML", CHATML, ("<|im_start|>", "<|im_end|>")),
)


def choose_chat_template(file_source: str | None, special_tokens: set[str], bos_token: str, eos_token: str,
                         override: tuple[str, str] | None = None,
                         file_origin: str = "the model file") -> tuple[ChatTemplate | None, str]:
    """(template, where it came from): `override` (--chat-template's text and where it came from,
    read by the caller) first, then the file's own, then the first built-in format whose special
    tokens the vocabulary has; else (None, why)."""
    if override is not None:
        source, origin = override
        return ChatTemplate(source, bos_token, eos_token), origin
    if file_source:
        return ChatTemplate(file_source, bos_token, eos_token), file_origin
    for chat_format in BUILTIN_FORMATS:
        if all(token in special_tokens for token in chat_format.needs):
            return (ChatTemplate(chat_format.source, bos_token, eos_token),
                    f"built-in {chat_format.name} (the file has none; chosen by its special tokens)")
    names = ", ".join(f.name for f in BUILTIN_FORMATS)
    return None, (f"the model has no chat template: the file carries none and its special tokens match none of "
                  f"the built-in formats ({names}); use /v1/completions, or start the server with "
                  "--chat-template FILE")
