"""Hugging Face checkpoint directories written by transformers itself, for the loader's tests:
tiny random models of each architecture (with a tiny byte-level or SentencePiece-style
tokenizer), the packaged GGUFs converted, and transformers' float32 forward as the reference."""

import shutil
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from batchproof.engine.model.gguf.tokenizer import QWEN2_PATTERN
from tests.helpers import tiny_gguf, tiny_spm

# One small config per architecture (transformers' own classes fill in the rest). Gemma 3's 7
# layers put a global layer at the 6th and windows of 8 on the others, which the prompts exceed.
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)
TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    # (attention_bias would add an o_proj bias, which llama.cpp's llama has no place for: refused)
    "llama-tied-llama3-rope": ("LlamaConfig", {"tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 24}),
    "gemma3": ("Gemma3TextConfig", {"num_hidden_layers": 7, "head_dim": 32, "sliding_window": 8,
                                    "query_pre_attn_scalar": 32}),
}
CHATML = tiny_gguf.CHATML_TEMPLATE


def byte_level_tokenizer(is_qwen: bool) -> HFTokenizer:
    """tiny_gguf's vocabulary (256 bytes, 10 merges, 3 specials) as a tokenizer.json would hold it:
    SmolLM's splitting, or Qwen's (transformers rebuilds a qwen's tokenizer from its own class
    whatever tokenizer.json says, so a qwen's file spells Qwen's pipeline, as real ones do)."""
    tokens, _ = tiny_gguf.vocab()
    plain = tokens[:-len(tiny_gguf.SPECIAL_TOKENS)]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(plain)}, merges=tiny_gguf.MERGES))
    if is_qwen:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tiny_gguf.SPECIAL_TOKENS])
    return tok


def sentencepiece_tokenizer() -> HFTokenizer:
    """tiny_spm's pieces as Gemma's tokenizer.json spells them: spaces as "▁", byte fallback."""
    tokens, scores, _ = tiny_spm.vocab()
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    plain = [t for t in tokens if t not in ("<unk>", "<s>", "</s>", *tiny_spm.USER_DEFINED)]
    vocab = {t: i for i, t in enumerate(["<unk>", *plain])}
    ranked = sorted((s, t) for t, s in zip(tokens, scores) if len(t) > 1 and not t.startswith("<"))
    merges = [(t[:cut], t[cut:]) for _, t in reversed(ranked) for cut in range(1, len(t))
              if t[:cut] in vocab and t[cut:] in vocab][:40]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(" "), behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    # Gemma's tokenizer.json puts <bos> first (transformers' tokenizer(text) adds it)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    return tok


GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\n' + m['content'] + "
                  "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}"
                  "{% endif %}")


def save_tokenizer(directory: Path, arch: str) -> None:
    """tokenizer.json, tokenizer_config.json and the chat template, as transformers writes them."""
    from transformers import PreTrainedTokenizerFast

    if arch == "gemma3":
        fast = PreTrainedTokenizerFast(tokenizer_object=sentencepiece_tokenizer(), bos_token="<bos>",
                                       eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
        fast.chat_template = GEMMA_TEMPLATE
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(arch.startswith("qwen")),
                                       bos_token="<|im_start|>",
                                       eos_token="<|im_end|>")
        fast.chat_template = CHATML
    fast.save_pretrained(directory)


def tiny_model(name: str, seed: int = 0):
    """A transformers model of TINY_CONFIGS[name], its weights drawn so the logits are peaked
    (well-separated greedy choices) and every norm differs from its default."""
    import transformers

    class_name, extra = TINY_CONFIGS[name]
    config = getattr(transformers, class_name)(**(COMMON | extra))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="eager")
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:  # Gemma's are offsets from 1; the others multiply directly
                p.copy_((0.0 if "gemma" in class_name.lower() else 1.0) + 0.1 * torch.randn(p.shape, generator=rng))
            elif pname.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=rng))
            elif "embed" in pname:
                p.copy_(torch.randn(p.shape, generator=rng))
            else:
                p.copy_(torch.randn(p.shape, generator=rng) / p.shape[1] ** 0.5)
    return model.eval()


def write_checkpoint(model, directory: Path, arch: str, dtype: torch.dtype = torch.float32, **save_args) -> Path:
    """save_pretrained in `dtype`, plus the tokenizer (transformers' own writers throughout)."""
    if directory.exists():
        shutil.rmtree(directory)
    model.to(dtype).save_pretrained(directory, **save_args)
    model.to(torch.float32)
    save_tokenizer(directory, arch)
    return directory


def reference_logprobs(directory: Path, token_ids: list[int]) -> torch.Tensor:
    """transformers' float32 forward on the directory: log-softmax rows [len(token_ids), vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def convert_gguf(gguf_path: Path, out_dirs: dict[torch.dtype, Path]) -> None:
    """The issue's recipe: transformers reads the GGUF (dequantized), its state dict goes into a
    model built from the config (a GGUF-loaded model refuses save_pretrained), saved per dtype
    with the tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = loaded.config
    config.quantization_config = None  # the weights saved are plain floats
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    for dtype, directory in out_dirs.items():
        model.to(dtype).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    model.to(torch.float32)


def greedy_check(records: list, reference: torch.Tensor, prompt_len: int, atol: float = 1e-4) -> float:
    """Our greedy records against the reference rows: the same argmax at every step and the
    chosen and top logprobs within atol -> the largest difference seen."""
    worst = 0.0
    for i, record in enumerate(records):
        row = reference[prompt_len - 1 + i]
        assert record.token_id == int(row.argmax()), f"step {i}: we chose {record.token_id}, not {int(row.argmax())}"
        worst = max(worst, abs(record.logprob - float(row[record.token_id])))
        for entry in record.top:
            worst = max(worst, abs(entry.logprob - float(row[entry.token_id])))
    assert worst <= atol, f"logprobs differ from transformers' by {worst}"
    return worst


def as_array(records: list) -> np.ndarray:
    """(token id, logprob) of every record and its top entries, for bitwise comparison."""
    return np.array([(e.token_id, e.logprob) for r in records for e in (r, *r.top)], dtype=np.float64)
