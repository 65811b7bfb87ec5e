"""Analytic compute cost of every sampler: forward passes, positions computed, FLOPs.

    python -m experiments.bench.compute_cost --prompt 1000 --gen 256 --block 32 --steps 256 \\
        --tokens-per-step 4 [--model CONFIG_JSON_or_DIR | --params N --layers L --d-model D \\
        --vocab V] [--plot cost.png] [--json cost.json]

Every sampler is written down as its list of forwards ``(query columns Q, key columns K, LM-head
columns H)``; a forward costs :func:`dlm.stats.forward_flops` ``= 2 N Q + 4 n_layers d Q K +
2 d V H`` (Kaplan et al. 2020 dense term, plus attention and the vocabulary head). With
``P`` prompt and ``G = n_b L`` answer columns, ``T = P + G`` and ``s`` steps per block:

==================  ==============================================================================
AR + KV cache       prefill (Q=P, K=P, H=1), then G-1 decode forwards (Q=1, K=P+j, H=1), j=1..G-1
full-seq diffusion  LLaDA (Nie et al. 2025) with one block L = G: s forwards of (T, T, G)
semi-AR blocks      LLaDA semi-AR: n_b s forwards of (T, T, L) (no cache, so no saving)
BD3-LM exact        (Arriola et al. 2025, Alg. 2; ``bd3lm.sample``): prompt once (P, P, 0); per
                    block s steps of (L, P+(b+1)L, L); one committing forward (L, P+(b+1)L, 0)
                    after every block but the last
Fast-dLLM prefix    (Wu et al. 2025, Sec. 3.2; ``fastdllm.generate``): per block one full forward
                    (T, T, L), then s-1 windows over [lo, T): (T-lo, T, L)
Fast-dLLM dual      as prefix with windows over the block only: (L, T, L)
==================  ==============================================================================

Dream-style models under Fast-dLLM's LLaDA rules (``shift_logits``) widen each cached window by one
column (the Dream rules do not). Decoding is either
the top-k schedule (``--steps`` K in all, ``s = K / n_b``) or parallel decoding (Fast-dLLM eq. 5/6)
at an expected ``R`` tokens per step (``s = ceil(L / R)``, ``L = G`` for full-sequence). AR has
no parallel variant. Counts match ``SampleStats.nfe`` / ``positions_computed`` of real runs
(tests/test_compute_cost.py); FLOPs match ``stats.extra['flops']`` up to float64 rounding.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from dlm.io import stable_json
from dlm.stats import forward_flops
from dlm import registry
from harness.cli import markdown_table, parser, run_main

#: LLaDA-8B (Nie et al. 2025, Tab. 5): the default model of the table.
LLADA_8B = dict(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                mlp_hidden=12288)
STRATEGIES = ("ar", "full_diffusion", "semi_ar", "bd3lm", "fastdllm_prefix", "fastdllm_dual")
LABELS = {"ar": "AR + KV cache", "full_diffusion": "full-sequence diffusion (LLaDA, block = G)",
          "semi_ar": "semi-AR blocks (LLaDA)", "bd3lm": "BD3-LM exact cache",
          "fastdllm_prefix": "Fast-dLLM prefix cache", "fastdllm_dual": "Fast-dLLM dual cache"}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class CostModel:
    """What FLOPs depend on: non-embedding parameters N, layers, width, vocabulary."""

    n_params: int
    n_layers: int
    d_model: int
    vocab_size: int
    shift_logits: bool = False

    def __post_init__(self) -> None:
        for name in ("n_params", "n_layers", "d_model", "vocab_size"):
            _positive_int(name, getattr(self, name))

    @classmethod
    def from_config(cls, cfg, rules: str = "auto") -> "CostModel":
        """From a :class:`dlm.model.ModelConfig` (same N as ``fastdllm.window_flops``); windows
        widen by one column only for a Dream-style model under ``rules="llada"``
        (:mod:`fastdllm.dream`: the Dream rules start them at the block)."""
        if rules != "auto" and rules not in registry.names("family"):
            raise ValueError(f"rules must be auto or a registered family {registry.names('family')}, got {rules!r}")
        return cls(cfg.num_params(include_embeddings=False), cfg.n_layers, cfg.d_model,
                   cfg.vocab_size, bool(cfg.shift_logits) and rules == "llada")

    def flops(self, q: np.ndarray, k: np.ndarray, head: np.ndarray) -> np.ndarray:
        """Per-forward FLOPs (float64, exact below 2**53) of (F,) query / key / head counts."""
        f = np.float64
        return forward_flops(f(self.n_params), self.n_layers, self.d_model, q.astype(f), k.astype(f),
                             self.vocab_size, head.astype(f))


@dataclass(frozen=True)
class Forwards:
    """One sampler run as its forwards: q, k, head are (F,) int arrays."""

    q: np.ndarray
    k: np.ndarray
    head: np.ndarray

    @property
    def passes(self) -> int:
        return int(self.q.size)

    @property
    def positions(self) -> int:
        return int(self.q.sum())

    @staticmethod
    def cat(*parts: tuple) -> "Forwards":
        """From (q, k, head) triples of broadcastable arrays / ints."""
        qs, ks, hs = [], [], []
        for q, k, h in parts:
            q, k, h = np.broadcast_arrays(np.asarray(q, np.int64), np.asarray(k, np.int64),
                                          np.asarray(h, np.int64))
            qs.append(q.ravel()), ks.append(k.ravel()), hs.append(h.ravel())
        return Forwards(np.concatenate(qs), np.concatenate(ks), np.concatenate(hs))


def _layout(prompt: int, gen: int, block: int, steps_per_block: int) -> tuple[int, int, np.ndarray]:
    """Validated (T, n_blocks, block starts lo_b (n_b,))."""
    for name, v in (("prompt", prompt), ("gen", gen), ("block", block), ("steps_per_block", steps_per_block)):
        _positive_int(name, v)
    if gen % block:
        raise ValueError(f"gen={gen} must be divisible by block={block}")
    nb = gen // block
    return prompt + gen, nb, prompt + block * np.arange(nb)


def ar_forwards(prompt: int, gen: int) -> Forwards:
    """Autoregressive decoding with a KV cache: prefill, then one column per token."""
    _positive_int("prompt", prompt), _positive_int("gen", gen)
    j = np.arange(1, gen)  # decode forwards feed token j-1 at column P+j-1 over P+j keys
    return Forwards.cat((prompt, prompt, 1), (np.ones_like(j), prompt + j, 1))


def baseline_forwards(prompt: int, gen: int, block: int, steps_per_block: int) -> Forwards:
    """``dlm.llada.generate`` (= ``fastdllm.generate(cache=None)``): every step recomputes
    prompt + answer; the LM head runs on the current block."""
    T, nb, _ = _layout(prompt, gen, block, steps_per_block)
    return Forwards.cat((np.full(nb * steps_per_block, T), T, block))


def bd3lm_forwards(prompt: int, gen: int, block: int, steps_per_block: int) -> Forwards:
    """``bd3lm.sample(use_cache=True, stop_at_eos=False, align="prompt", mode="topk")``."""
    T, nb, lo = _layout(prompt, gen, block, steps_per_block)
    hi = lo + block  # (n_b,) keys of block b: everything up to its end (block-causal)
    steps_k = np.repeat(hi, steps_per_block)  # (n_b s,)
    return Forwards.cat((prompt, prompt, 0), (block, steps_k, block), (block, hi[:-1], 0))


def fastdllm_forwards(prompt: int, gen: int, block: int, steps_per_block: int, cache: Optional[str],
                      refresh_every: Optional[int] = None, shift_logits: bool = False) -> Forwards:
    """``fastdllm.generate`` with the top-k schedule: per block a full forward at step 0 (and at
    every ``refresh_every``-th step), otherwise the policy's window over all T keys."""
    if cache is None:
        return baseline_forwards(prompt, gen, block, steps_per_block)
    if cache not in ("prefix", "dual"):
        raise ValueError(f"cache must be None, 'prefix' or 'dual', got {cache!r}")
    T, nb, lo = _layout(prompt, gen, block, steps_per_block)
    i = np.arange(steps_per_block)  # (s,)
    full = (i == 0) if refresh_every is None else (i % _positive_int("refresh_every", refresh_every) == 0)
    width = (T - lo if cache == "prefix" else np.full(nb, block)) + int(shift_logits)  # (n_b,)
    q = np.where(full[None, :], T, width[:, None])  # (n_b, s)
    return Forwards.cat((q, T, block))


@dataclass(frozen=True)
class CostRow:
    strategy: str
    decoding: str
    steps: int
    passes: int
    positions: int
    flops: float


def sampler_forwards(strategy: str, prompt: int, gen: int, block: int, steps_per_block: int,
                     shift_logits: bool = False) -> Forwards:
    """Forwards of one of :data:`STRATEGIES` (AR ignores block and steps)."""
    if strategy == "ar":
        return ar_forwards(prompt, gen)
    if strategy == "full_diffusion":
        return baseline_forwards(prompt, gen, gen, steps_per_block)
    if strategy == "semi_ar":
        return baseline_forwards(prompt, gen, block, steps_per_block)
    if strategy == "bd3lm":
        return bd3lm_forwards(prompt, gen, block, steps_per_block)
    if strategy in ("fastdllm_prefix", "fastdllm_dual"):
        return fastdllm_forwards(prompt, gen, block, steps_per_block, strategy.split("_")[1],
                                 shift_logits=shift_logits)
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def cost_table(model: CostModel, prompt: int, gen: int, block: int, steps: int,
               tokens_per_step: Optional[float] = None) -> list[CostRow]:
    """All strategies; top-k with ``steps`` in all and, if given, parallel decoding at
    ``tokens_per_step`` R (``ceil(L / R)`` steps per block)."""
    _layout(prompt, gen, block, 1)
    nb = gen // block
    _positive_int("steps", steps)
    if steps % nb:
        raise ValueError(f"steps={steps} must be a multiple of the number of blocks gen/block={nb}")
    if tokens_per_step is not None and (isinstance(tokens_per_step, bool)
                                        or not isinstance(tokens_per_step, (int, float))
                                        or not tokens_per_step >= 1):
        raise ValueError(f"tokens_per_step must be a number >= 1, got {tokens_per_step!r}")
    rows = []
    for strategy in STRATEGIES:
        L = gen if strategy == "full_diffusion" else block
        modes = [("sequential", 1)] if strategy == "ar" else [(f"top-k, {steps} steps", steps * L // gen)]
        if tokens_per_step is not None and strategy != "ar":
            modes.append((f"parallel, {tokens_per_step:g} tok/step", math.ceil(L / tokens_per_step)))
        for decoding, s in modes:
            fw = sampler_forwards(strategy, prompt, gen, block, s, model.shift_logits)
            n_steps = gen if strategy == "ar" else s * gen // L
            rows.append(CostRow(strategy, decoding, n_steps, fw.passes, fw.positions,
                                float(model.flops(fw.q, fw.k, fw.head).sum())))
    return rows


def markdown(rows: list[CostRow], prompt: int, gen: int) -> str:
    ar = next(r for r in rows if r.strategy == "ar")
    header = ("strategy", "decoding", "steps", "passes", "positions", "FLOPs", "positions / AR", "FLOPs / AR")
    cells = [(LABELS[r.strategy], r.decoding, f"{r.steps:,}", f"{r.passes:,}", f"{r.positions:,}", f"{r.flops:.3e}",
              f"{r.positions / ar.positions:.1f}x", f"{r.flops / ar.flops:.1f}x") for r in rows]
    lines = [f"prompt {prompt} + answer {gen} tokens", "", *markdown_table(header, cells, "llrrrrrr")]
    return "\n".join(lines) + "\n"


def plot(model: CostModel, prompt: int, gen: int, block: int, steps: int,
         tokens_per_step: Optional[float], path: Path) -> None:
    """FLOPs and positions vs answer length G (block, 2 block, ... 4 gen), log y; steps per block
    (hence tokens per step) held at the table's values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = block * 2 ** np.arange(int(math.log2(max(4 * gen // block, 1))) + 1)
    spb = steps * block // gen
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for color, strategy in enumerate(STRATEGIES):
        series = {}
        for G in gens:
            G = int(G)
            for r in cost_table(model, prompt, G, block, spb * G // block, tokens_per_step):
                if r.strategy == strategy:
                    series.setdefault(r.decoding.split(",")[0], []).append((G, r.positions, r.flops))
        for decoding, pts in series.items():
            g, pos, fl = np.array(pts).T
            style = "--" if decoding == "parallel" else "-"
            label = f"{LABELS[strategy]} ({decoding})"
            for ax, y in zip(axes, (pos, fl)):
                ax.plot(g, y, style, color=f"C{color}", marker="o", ms=3, label=label)
    for ax, name in zip(axes, ("positions computed", "FLOPs")):
        ax.set(xscale="log", yscale="log", xlabel="answer length G", ylabel=name,
               title=f"{name}, prompt {prompt}, block {block}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cost_model_from_args(args) -> CostModel:
    manual = [args.params, args.layers, args.d_model, args.vocab]
    if args.model is not None:
        if any(v is not None for v in manual):
            raise ValueError("give either --model or --params/--layers/--d-model/--vocab, not both")
        from dlm.checkpoints import read_config
        from dlm.layouts import config_from_json

        path = Path(args.model)
        if path.is_dir():
            cfg, _ = read_config(path)
        elif path.is_file():
            cfg = config_from_json(json.loads(path.read_text()))
        else:
            raise ValueError(f"--model {args.model!r} is neither a config.json nor a checkpoint directory")
        return CostModel.from_config(cfg)
    if any(v is not None for v in manual):
        if any(v is None for v in manual):
            raise ValueError("--params, --layers, --d-model and --vocab must be given together")
        return CostModel(*manual)
    from dlm.model import ModelConfig

    return CostModel.from_config(ModelConfig(**LLADA_8B))


def main(argv=None) -> list[CostRow]:
    p = parser("experiments.bench.compute_cost", __doc__, paragraphs=2)
    p.add_argument("--prompt", type=int, required=True, metavar="P", help="prompt tokens P")
    p.add_argument("--gen", type=int, required=True, metavar="G", help="answer tokens G")
    p.add_argument("--block", type=int, required=True, metavar="L", help="block length L (divides G)")
    p.add_argument("--steps", type=int, required=True, metavar="K",
                   help="top-k denoising steps K in all (multiple of G/L)")
    p.add_argument("--tokens-per-step", type=float, default=None, metavar="R",
                   help="tokens per step R of parallel decoding (adds rows)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="config.json or checkpoint dir (default: LLaDA-8B)")
    p.add_argument("--params", type=int, default=None, metavar="N", help="non-embedding parameters N")
    p.add_argument("--layers", type=int, default=None, metavar="N", help="number of layers")
    p.add_argument("--d-model", type=int, default=None, metavar="D", help="model width")
    p.add_argument("--vocab", type=int, default=None, metavar="V", help="vocabulary size")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a cost-vs-G plot here")
    p.add_argument("--json", default=None, metavar="PATH", help="write the table as JSON here")
    p.add_argument("--md", default=None, metavar="PATH", help="write the printed markdown table here")
    args = p.parse_args(argv)
    model = cost_model_from_args(args)
    rows = cost_table(model, args.prompt, args.gen, args.block, args.steps, args.tokens_per_step)
    table = markdown(rows, args.prompt, args.gen)
    print(table, end="")
    from harness.results import atomic_write_text, git_sha

    if args.md:
        atomic_write_text(Path(args.md), f"{table}\ngit {git_sha()}; model {asdict(model)}\n")
    if args.json:
        payload = {"git_sha": git_sha(), "model": asdict(model),
                   "config": {k: getattr(args, k) for k in ("prompt", "gen", "block", "steps", "tokens_per_step")},
                   "rows": [asdict(r) for r in rows]}
        atomic_write_text(Path(args.json), stable_json(payload, indent=1) + "\n")
    if args.plot:
        plot(model, args.prompt, args.gen, args.block, args.steps, args.tokens_per_step, Path(args.plot))
    return rows


if __name__ == "__main__":
    run_main(main)
