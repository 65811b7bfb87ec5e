"""How far Fast-dLLM's approximate KV cache drifts from exact recomputation.

    python -m experiments.eval.drift [--model DIR] [--prompts 2] [--gen 128 --block 32] \\
        [--cache dual|prefix] [--refresh block every:4 ...] [--run NAME] [--out-dir results/drift]

Fast-dLLM (Wu et al. 2025, Sec. 3.2) reuses K/V computed at the start of a block (or at the last
refresh) while the block is decoded; they are *stale* because attention is bidirectional: a
cached column's deeper-layer K/V depend on the block's tokens, which change every step. At
every step of the approximate run the sampler's state ``x`` (before the step's commit) is also
run exactly: one full forward over ``x`` that writes fresh K/V of every column. Per step and
layer ``l`` we report, on the columns the step reads from the cache (dual: ``[0, lo) ∪ [hi, T)``,
prefix: ``[0, lo)``; one column fewer before the block for Dream-style shifted logits)

- ``cos(K_cached, K_exact)`` per column, averaged, and the relative error
  ``||K_cached - K_exact||_F / ||K_exact||_F`` (same for V);
- ``KL(p_exact || p_approx)`` of the next-token distributions on the block's masked columns
  (the [MASK] logit removed, as the sampler does);
- the rate at which a committed token differs from the exact model's greedy proposal;

and, per prompt, the first answer position at which the approximate run's output differs from
an exact (uncached, ``cache=None``) run with the same rule and seed. Layer-0 K/V of an unchanged
column depend only on its token and position, so layer 0 of the cache is always exact and a
one-layer model does not drift at all; deeper layers drift. ``--refresh every:1`` recomputes
everything each step: no drift. Without ``--model`` a tiny random model (seconds on a CPU).

Writes ``<out-dir>/<run>.json`` (config, git SHA, per-step records) and ``<run>.md``, and
``<out-dir>/<run>/k_cos_by_layer.png`` and ``kl_by_step.png``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from dlm.io import stable_json
from dlm.cache import KVCache
from dlm.commit import suppress_logits
from dlm.validate import check_blocks
from dlm import registry
from dlm.spec import resolve_family
from harness.cli import check_out, parser, reading, run_main
from harness.results import REPO, arith_config_of, atomic_write_text, config_hash, git_sha


def parse_refresh(text: str, cache: str = "dual") -> dict:
    """A policy to compare -> ``fastdllm.generate`` cache arguments: ``block`` (``cache`` refreshed
    at each block start), ``every:K`` (and every K-th step), ``delayed[:D]`` (dKV-Cache, delay D),
    ``adaptive:TOL`` / ``adaptive-nb:TOL`` (drift-refreshed dual, with / without the block-start
    refresh)."""
    head, _, k = str(text).partition(":")
    try:
        if text == "block":
            return {"cache": cache}
        if head == "every" and k.isdigit() and int(k) >= 1:
            return {"cache": cache, "refresh_every": int(k)}
        if head == "delayed" and (not k or (k.isdigit() and int(k) >= 1)):
            return {"cache": "delayed", "delay": int(k) if k else 1}
        if head in ("adaptive", "adaptive-nb") and k:
            return {"cache": "adaptive", "tolerance": float(k), "every_block": head == "adaptive"}
    except ValueError:
        pass
    raise ValueError(f"refresh must be 'block', 'every:K', 'delayed[:D]', 'adaptive:TOL' or 'adaptive-nb:TOL' "
                     f"(integers K, D >= 1), got {text!r}")


@dataclass(frozen=True)
class DriftConfig:
    gen: int = 128
    block: int = 32
    steps: Optional[int] = None  # default gen (one token per step, top-k)
    cache: str = "dual"
    threshold: Optional[float] = None
    temperature: float = 0.0
    seed: int = 0
    rules: str = "auto"  # fastdllm.dream: Dream rules for Dream-style models unless "llada"

    def __post_init__(self) -> None:
        if self.rules != "auto" and self.rules not in registry.names("family"):
            raise ValueError(f"rules must be auto or a registered family {registry.names('family')}, "
                             f"got {self.rules!r}")
        if self.cache not in ("dual", "prefix"):
            raise ValueError(f"cache must be 'dual' or 'prefix', got {self.cache!r}")
        check_blocks(self.gen, self.block, self.gen if self.steps is None else self.steps)


@dataclass(frozen=True)
class StepDrift:
    """One denoising step; per-layer tuples have n_layers entries."""

    block: int
    step: int
    full: bool
    k_cos: tuple
    k_err: tuple
    v_cos: tuple
    v_err: tuple
    kl_mean: float
    kl_max: float
    committed: int
    differ: int


@dataclass(frozen=True)
class PromptDrift:
    steps: tuple  # of StepDrift
    first_divergence: Optional[int]  # first differing answer position vs the exact run
    nfe: int
    positions: int
    refreshes: int = 0  # forwards that recomputed every column


def cache_columns(cache: str, lo: int, hi: int, T: int, shift_logits: bool) -> Tensor:
    """Columns a cached step of block [lo, hi) reads from the cache (fastdllm.policies.window):
    prefix ``[0, lo)``, dual / adaptive also ``[hi, T)``; delayed: the prefix ``[0, lo)`` (it
    recomputes the masked suffix, and the last block's final commits once)."""
    start = lo - int(shift_logits)
    before = torch.arange(start)
    return before if cache in ("prefix", "delayed") else torch.cat([before, torch.arange(hi, T)])


def kv_drift(cached: Tensor, exact: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
    """(L, B, H, T, D) cached vs exact on ``cols`` -> (mean column cosine (L,), rel. error (L,))."""
    L = cached.shape[0]
    if cols.numel() == 0:
        return torch.ones(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64)
    a = cached[:, :, :, cols].double().permute(0, 1, 3, 2, 4).flatten(3)  # (L, B, C, H*D)
    b = exact[:, :, :, cols].double().permute(0, 1, 3, 2, 4).flatten(3)
    na, nb = (a * a).sum(-1), (b * b).sum(-1)  # (L, B, C)
    denom = torch.sqrt(na * nb)
    cos = torch.where(denom > 0, (a * b).sum(-1) / denom.clamp_min(1e-300), (na == nb).double())
    err = (a - b).flatten(1).norm(dim=-1) / b.flatten(1).norm(dim=-1).clamp_min(1e-300)
    return cos.flatten(1).mean(-1), err


def kl_divergence(exact_logits: Tensor, approx_logits: Tensor, mask_id: int) -> Tensor:
    """KL(softmax(exact) || softmax(approx)) per column, (B, L, V) -> (B, L), [MASK] excluded."""
    lp = torch.log_softmax(suppress_logits(exact_logits, (mask_id,)).double(), -1)
    lq = torch.log_softmax(suppress_logits(approx_logits, (mask_id,)).double(), -1)
    p = lp.exp()
    return torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1)


@torch.no_grad()
def measure(model, input_ids: Tensor, cfg: DriftConfig, policy: Optional[dict] = None) -> PromptDrift:
    """Approximate run of one prompt (1, P) with the exact recomputation at every step."""
    from fastdllm.generate import generate as fast_generate

    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one prompt (1, P), got shape {tuple(input_ids.shape)}")
    mid = model.config.mask_token_id
    shift = resolve_family(cfg.rules, model.config) == "llada" and model.config.shift_logits  # window one column early
    T = input_ids.shape[1] + cfg.gen
    fresh = KVCache.for_model(model, 1, T)
    records = []

    def observe(v) -> None:
        lo, hi = v.lo, v.hi
        before = v.x.clone()
        before[:, lo:hi] = torch.where(v.commit, torch.full_like(v.commit, mid, dtype=v.x.dtype), v.x[:, lo:hi])
        fresh.reset()
        exact = model(before, cache=fresh, commit=True, logits_slice=slice(lo, hi))  # (1, L, V)
        cols = cache_columns(policy["cache"], lo, hi, T, shift).to(v.x.device)
        k_cos, k_err = kv_drift(v.cache.k, fresh.k, cols)
        v_cos, v_err = kv_drift(v.cache.v, fresh.v, cols)
        masked = before[:, lo:hi] == mid  # (1, L)
        kl = kl_divergence(exact, v.logits, mid)[masked]
        greedy = suppress_logits(exact, (mid,)).argmax(-1)  # (1, L)
        records.append(StepDrift(v.block, v.step, v.full, tuple(k_cos.tolist()), tuple(k_err.tolist()),
                                 tuple(v_cos.tolist()), tuple(v_err.tolist()),
                                 float(kl.mean()) if kl.numel() else 0.0, float(kl.max()) if kl.numel() else 0.0,
                                 int(v.commit.sum()), int((v.commit & (v.x[:, lo:hi] != greedy)).sum())))

    kw = dict(gen_length=cfg.gen, block_length=cfg.block, steps=cfg.steps, threshold=cfg.threshold,
              temperature=cfg.temperature, rules=cfg.rules)
    dev = input_ids.device
    policy = {"cache": cfg.cache, **(policy or {})}
    out = fast_generate(model, input_ids, **policy, callback=observe,
                        generator=torch.Generator(dev).manual_seed(cfg.seed), **kw)
    ref = fast_generate(model, input_ids, cache=None, generator=torch.Generator(dev).manual_seed(cfg.seed), **kw)
    diff = torch.nonzero(out.sequences[0] != ref.sequences[0]).flatten()
    first = int(diff[0]) - input_ids.shape[1] if diff.numel() else None
    return PromptDrift(tuple(records), first, out.stats.nfe, out.stats.positions_computed,
                       int(out.stats.row_refreshes[0]))


def summarize(runs: list[PromptDrift]) -> dict:
    """Means over all steps of all prompts: per layer, per step within a block, overall."""
    steps = [s for r in runs for s in r.steps]
    per_layer = {m: np.mean([getattr(s, m) for s in steps], axis=0).tolist()
                 for m in ("k_cos", "k_err", "v_cos", "v_err")}
    by_step: dict[int, list[float]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append(s.kl_mean)
    committed = sum(s.committed for s in steps)
    return {**{f"{m}_by_layer": v for m, v in per_layer.items()},
            "kl_by_step": [float(np.mean(by_step[i])) for i in sorted(by_step)],
            "kl_mean": float(np.mean([s.kl_mean for s in steps])), "kl_max": max(s.kl_max for s in steps),
            "commit_differ_rate": sum(s.differ for s in steps) / max(committed, 1),
            "full_step_fraction": float(np.mean([s.full for s in steps])),
            "first_divergence": [r.first_divergence for r in runs],
            "nfe": float(np.mean([r.nfe for r in runs])), "positions": float(np.mean([r.positions for r in runs])),
            "refreshes": float(np.mean([r.refreshes for r in runs]))}


def _num(x: float, spec: str) -> str:
    """``x`` for a table: rounded to the shown precision first (``.6f``) or, in ``e`` notation,
    zero below 1e-12, so float noise cannot print ``-0.000000`` or a stray ``1e-17`` for 0."""
    if spec.endswith("e"):
        x = 0.0 if abs(x) < 1e-12 else x
    else:
        x = round(x, int(spec.strip(".f")))
    return f"{x + 0.0:{spec}}"  # + 0.0: -0.0 -> 0.0


def markdown(config: dict, summaries: dict) -> str:
    lines = [f"# KV-cache drift: {config['run']}", "",
             f"cache `{config['cache']}`, gen {config['gen']}, block {config['block']}, "
             f"{config['prompts']} prompt(s), model `{config['model']}`, git `{config['git_sha']}`", "",
             "| refresh | full steps | refreshes | mean KL | max KL | committed differ | first divergence | NFE | "
             "positions |", "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name, s in summaries.items():
        lines.append(f"| {name} | {_num(s['full_step_fraction'], '.2f')} | {_num(s.get('refreshes', float('nan')), '.2f')} | "
                     f"{_num(s['kl_mean'], '.3e')} | "
                     f"{_num(s['kl_max'], '.3e')} | {_num(s['commit_differ_rate'], '.3f')} | {s['first_divergence']} "
                     f"| {_num(s['nfe'], '.0f')} | {_num(s['positions'], '.0f')} |")
    lines += ["", "Per layer (mean over steps): K cos / K rel. error / V cos / V rel. error", "",
              "| refresh | layer | K cos | K err | V cos | V err |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in summaries.items():
        layers = zip(*(s[f"{m}_by_layer"] for m in ("k_cos", "k_err", "v_cos", "v_err")))
        for i, vals in enumerate(layers):
            lines.append(f"| {name} | {i} | " + " | ".join(_num(v, ".6f") for v in vals) + " |")
    return "\n".join(lines) + "\n"


def plot(summaries: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "k_cos_by_layer.png", out_dir / "kl_by_step.png"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, (name, s) in enumerate(summaries.items()):
        ax.plot(s["k_cos_by_layer"], "-o", color=f"C{c}", label=f"{name}: K")
        ax.plot(s["v_cos_by_layer"], "--s", color=f"C{c}", label=f"{name}: V", ms=4)
    ax.set(xlabel="layer", ylabel="cos(cached, exact)", title="cached K/V vs exact, mean over steps")
    ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout(), fig.savefig(paths[0], dpi=120), plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, (name, s) in enumerate(summaries.items()):
        ax.plot(s["kl_by_step"], "-o", color=f"C{c}", label=name, ms=3)
    ax.set(xlabel="step within block", ylabel="KL(exact || approx)", title="next-token KL on masked columns")
    ax.legend(fontsize=8), ax.grid(alpha=0.3)
    fig.tight_layout(), fig.savefig(paths[1], dpi=120), plt.close(fig)
    return paths


def tiny_random_model(n_layers: int = 4, seed: int = 0):
    """Random float32 model with peaky predictions (init std 0.2)."""
    from dlm.model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=n_layers, n_heads=4, n_kv_heads=2, mlp_hidden=128,
                      max_seq_len=1024, mask_token_id=63, eos_token_id=2, pad_token_id=0)
    model = Transformer(cfg)
    model.reset_parameters(std=0.2, generator=torch.Generator().manual_seed(seed))
    return model.eval()


def prompts_for(model, tok, n: int, length: int, seed: int, arith=None) -> list[Tensor]:
    """Arithmetic questions (of ``arith``, the checkpoint's task) through the tokenizer, else
    random non-special ids; (1, P) each."""
    if tok is not None:
        from experiments.cli.generate import encode
        from tasks.arith import ArithConfig, generate_problems

        problems = generate_problems(arith or ArithConfig(), n=n, split="test", seed=seed)
        return [encode(model, tok, p.question)[1] for p in problems]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, model.config.mask_token_id, (1, length), generator=g) for _ in range(n)]


def main(argv=None) -> dict:
    p = parser("experiments.eval.drift", __doc__, paragraphs=2)
    p.add_argument("--model", default=None, metavar="DIR", help="checkpoint dir (default: a tiny random model)")
    p.add_argument("--prompts", type=int, default=2, metavar="N", help="number of prompts (default 2)")
    p.add_argument("--prompt-len", type=int, default=16, metavar="P",
                   help="random prompt length (no tokenizer; default 16)")
    p.add_argument("--gen", type=int, default=128, metavar="G", help="answer tokens (default 128)")
    p.add_argument("--block", type=int, default=32, metavar="L", help="block length (default 32)")
    p.add_argument("--steps", type=int, default=None, metavar="S", help="top-k steps in all (default G)")
    p.add_argument("--threshold", type=float, default=None, metavar="T", help="threshold rule instead of top-k")
    p.add_argument("--cache", default="dual", choices=["dual", "prefix"], help="Fast-dLLM cache (default dual)")
    p.add_argument("--refresh", nargs="+", default=["block", "every:4"], metavar="POLICY",
                   help="block, every:K, delayed[:D], adaptive:TOL, adaptive-nb:TOL (default: block every:4)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default 0)")
    p.add_argument("--layers", type=int, default=4, metavar="N", help="layers of the tiny random model (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--run", default=None, metavar="NAME", help="run name (default <model>_<cache>_g<G>_b<L>)")
    p.add_argument("--out-dir", default=str(REPO / "results" / "drift"), metavar="DIR",
                   help="results dir (default results/drift)")
    p.add_argument("--dtype", default="float32", help="dtype for --model (default float32)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default cuda if available, else cpu)")
    args = p.parse_args(argv)
    check_out("--out-dir", args.out_dir)
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    policies = {name: parse_refresh(name, args.cache) for name in args.refresh}
    cfg = DriftConfig(args.gen, args.block, args.steps, args.cache, args.threshold, args.temperature, args.seed)
    if args.model is None:
        model, tok, model_name = tiny_random_model(args.layers, args.seed), None, "tiny-random"
    else:
        from dlm.checkpoints import load_model

        with reading("--model", args.model):
            model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
        model_name = Path(args.model).name
    device = next(model.parameters()).device
    arith = None if args.model is None else arith_config_of(args.model)
    prompts = [x.to(device) for x in prompts_for(model, tok, args.prompts, args.prompt_len, args.seed, arith)]
    run = args.run or f"{model_name}_{args.cache}_g{args.gen}_b{args.block}"
    fields = {k: v for k, v in asdict(cfg).items() if (k, v) != ("rules", "auto")}  # hashes of older runs kept
    config = {**fields, "run": run, "model": args.model or model_name, "prompts": args.prompts,
              "refresh": args.refresh, "git_sha": git_sha()}
    config["config_hash"] = config_hash(config)
    results = {name: [measure(model, x, cfg, k) for x in prompts] for name, k in policies.items()}
    summaries = {name: summarize(r) for name, r in results.items()}
    out_dir = Path(args.out_dir)
    payload = {"config": config, "summary": summaries,
               "per_prompt": {name: [asdict(r) for r in rs] for name, rs in results.items()}}
    atomic_write_text(out_dir / f"{run}.json", stable_json(payload) + "\n")
    md = markdown(config, summaries)
    atomic_write_text(out_dir / f"{run}.md", md)
    plots = plot(summaries, out_dir / run)
    print(md, end="")
    print(f"[wrote {out_dir / run}.json, .md, {', '.join(p.name for p in plots)}]")
    return {"config": config, "summary": summaries, "results": results}


if __name__ == "__main__":
    run_main(main)
