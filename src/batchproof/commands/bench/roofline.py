"""The roofline beside the speed figures: how many bytes a decode step reads and how many
floating-point operations a token costs, so a rate reads as GB/s (a single stream is bound
by memory) and GFLOPS (16 streams are bound by arithmetic) against this machine's own FMA
peak, measured in the same run.

The model's figures come from the loaded engine (torch is imported only through it)."""

import time
from dataclasses import dataclass

PEAK_SECONDS = 0.5  # per measurement of the FMA peak (the best of three is kept)


@dataclass
class Footprint:
    """One decode step's reads at c=1 and one token's arithmetic, at a context of `context` tokens."""

    weight_bytes_per_step: int  # every matmul weight once (the embedding: one row, unless it is the LM head)
    kv_bytes_per_step: int  # keys and values of `context` positions, every layer
    flops_per_token: int  # 2 per multiply-add: the matmuls, the LM head, attention over `context`
    context: int

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes_per_step + self.kv_bytes_per_step


@dataclass
class Roofline:
    footprint: Footprint
    fma_peak_gflops: float  # this machine, all threads, measured in this run
    c1_tok_s: float | None = None
    c16_aggregate_tok_s: float | None = None

    @property
    def c1_gb_s(self) -> float | None:
        return None if self.c1_tok_s is None else self.footprint.bytes_per_step * self.c1_tok_s / 1e9

    @property
    def c16_gflops(self) -> float | None:
        if self.c16_aggregate_tok_s is None:
            return None
        return self.footprint.flops_per_token * self.c16_aggregate_tok_s / 1e9

    def lines(self) -> list[str]:
        f = self.footprint
        lines = [f"roofline: a decode step reads {f.bytes_per_step / 1e6:.1f} MB (weights "
                 f"{f.weight_bytes_per_step / 1e6:.1f}, KV at {f.context} tokens {f.kv_bytes_per_step / 1e6:.1f}); "
                 f"a token costs {f.flops_per_token / 1e6:.0f} MFLOP; FMA peak {self.fma_peak_gflops:.1f} GFLOPS"]
        if self.c1_gb_s is not None:
            lines.append(f"roofline c=1: {self.c1_tok_s:.1f} tok/s x {f.bytes_per_step / 1e6:.1f} MB "
                         f"= {self.c1_gb_s:.2f} GB/s")
        if self.c16_gflops is not None:
            share = self.c16_gflops / self.fma_peak_gflops
            lines.append(f"roofline c=16: {self.c16_aggregate_tok_s:.1f} tok/s x {f.flops_per_token / 1e6:.0f} MFLOP "
                         f"= {self.c16_gflops:.1f} GFLOPS, {share:.0%} of the FMA peak")
        return lines

    def as_json(self) -> dict:
        f = self.footprint
        return {"bytes_per_step": f.bytes_per_step, "weight_bytes_per_step": f.weight_bytes_per_step,
                "kv_bytes_per_step": f.kv_bytes_per_step, "flops_per_token": f.flops_per_token,
                "context": f.context, "fma_peak_gflops": round(self.fma_peak_gflops, 2),
                "c1_gb_s": None if self.c1_gb_s is None else round(self.c1_gb_s, 3),
                "c16_gflops": None if self.c16_gflops is None else round(self.c16_gflops, 2)}


def _shape_and_bytes(weight) -> tuple[tuple[int, int], int]:
    if hasattr(weight, "parts"):  # kept in its GGUF blocks
        return weight.shape, weight.nbytes
    return tuple(weight.shape), weight.numel() * weight.element_size()


def footprint(engine, context: int) -> Footprint:
    """What one decode step of `engine`'s model reads and computes at `context` tokens."""
    model, spec = engine.model, engine.spec
    weight_bytes = macs = 0
    for layer in model.layers:
        for weight in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            (n, k), nbytes = _shape_and_bytes(weight)
            weight_bytes, macs = weight_bytes + nbytes, macs + n * k
    (vocab, dim), head_bytes = _shape_and_bytes(model.lm_head)
    weight_bytes, macs = weight_bytes + head_bytes, macs + vocab * dim
    if model.embed is not model.lm_head:
        weight_bytes += _shape_and_bytes(model.embed)[1] // vocab  # the one row looked up
    attended = [min(context, spec.window(i) or context) for i in range(spec.num_layers)]
    kv_bytes = sum(2 * spec.num_kv_heads * spec.head_dim * 4 * n for n in attended)
    attention_macs = sum(2 * spec.num_heads * spec.head_dim * n for n in attended)  # q.k and p.v
    return Footprint(weight_bytes, kv_bytes, 2 * (macs + attention_macs), context)


def fma_peak_gflops(num_threads: int) -> float:
    """This machine's float32 FMA peak on `num_threads` threads: the kernels' plain FMA loop
    (independent accumulators, no memory traffic), the best of three runs."""
    from batchproof.engine.model.ops import kernels

    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        flops = kernels.fma_peak(PEAK_SECONDS, num_threads)
        best = max(best, flops / (time.perf_counter() - started) / 1e9)
    return best
