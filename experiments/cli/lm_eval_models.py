"""lm-evaluation-harness models ``fastdllm`` and ``bd3lm`` (needs ``pip install -e ".[eval]"``).

    python -m experiments.cli.lm_eval_models --model fastdllm \\
        --model_args pretrained=PATH,policy=dual,threshold=0.9,gen_length=256,block_length=32 \\
        --tasks gsm8k_local --include_path experiments/cli/lm_eval_tasks --batch_size 8
    python -m experiments.cli.lm_eval_models --model bd3lm --model_args pretrained=BD3_PATH,gen_length=64 ...

It registers both models, then runs lm-eval's own CLI; in Python, import it, then ``lm_eval.simple_evaluate``.

generate_until: the prompts of a batch are left padded and decoded by one
:class:`dlm.spec.Sampler` (``fastdllm``: ``strategy=NAME`` from the grids, or any sampler field
and registered option, e.g. ``policy=dual,threshold=0.9``, :mod:`harness.sampler_flags`; a
Dream checkpoint gets Fast-dLLM's Dream rules unless ``family=llada``; ``bd3lm``: the exact
block-causal cache with the model's block size); the text is cut at the first EOS / EoT and then at the
first of the request's ``until`` strings. ``gen_length`` is fixed by the model args (the
request's ``max_gen_toks`` / sampling kwargs are ignored; greedy unless ``temperature``).

Every prompt is checked before the first forward (:mod:`harness.prompt_checks`): too long for
``max_seq_len`` (refused naming task and doc unless ``truncate=left``: cut, with a warning), the
mask token's text or a few-shot example that is an evaluated question (refused), text the
tokenizer cannot represent (reported).

loglikelihood: ``fastdllm`` (bidirectional LLaDA / Dream / native models) uses LLaDA's
Monte-Carlo ELBO (Nie et al. 2025, eq. 6; their ``get_log_likelihood``): each of ``mc_num``
rows masks ``l`` of the ``L`` continuation tokens, ``l`` stratified over ``{1..L}``, and adds
``L / l`` times the cross-entropy of the masked tokens; the estimate is minus the mean over rows.
``bd3lm`` uses the BD3-LM NELBO (eq. 8) of the continuation given the context laid out as one
clean block (prompt alignment), averaged over ``mc_num`` rows; with block size 1 it is the exact
AR log-likelihood (every token masked, ``t = 1``). ``is_greedy`` (``check_greedy=True``) decodes
the continuation greedily one token per step and compares. Each request's noise comes from a
generator seeded with ``seed``, so the choices of one question share random numbers.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import warnings
from typing import Optional

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from torch import Tensor
from tqdm import tqdm

from dlm import registry
from dlm.likelihood import mc_loglikelihood  # noqa: F401  (LLaDA eq. 6; re-exported)
from dlm.sample import stop_ids
from dlm.spec import Sampler, generate
from tasks.evaluate import left_pad, length_batches, padding_waste
from harness.prompt_checks import check_contexts_unseen, fit_or_cut, mask_error, token_trouble, unk_note
from harness.cli import add_list_flag, dtype_of, parser, reading, run_main
from harness.results import apply_stop_strings, decode_until_stop
from harness.grids import listing, resolve, sampler_names
from harness.sampler_flags import sampler_from_model_args


def _positive(name: str, value) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@torch.no_grad()
def bd3_loglikelihood(model, block_size: int, prefix: Tensor, target: Tensor, mc_num: int = 128,
                      batch_size: int = 32, generator: Optional[torch.Generator] = None) -> float:
    """Minus the BD3-LM NELBO of ``target`` (L,) given ``prefix`` (P >= 1,) as a clean block,
    averaged over ``mc_num`` rows; exact (one row, ``t = 1``) for ``block_size == 1``."""
    from bd3lm.loss import bd3_nelbo

    mc_num, batch_size = _positive("mc_num", mc_num), _positive("mc_batch_size", batch_size)
    if mc_num % batch_size:
        raise ValueError(f"mc_num={mc_num} must be a multiple of mc_batch_size={batch_size}")
    if prefix.numel() == 0 or target.numel() == 0:
        raise ValueError("prefix and target must both be non-empty")
    dev = next(model.parameters()).device
    exact = block_size == 1
    b, rounds = (1, 1) if exact else (batch_size, mc_num // batch_size)
    ids = torch.cat([prefix, target]).to(dev)[None].repeat(b, 1)  # (b, P + L)
    batch = {"input_ids": ids, "prompt_lengths": torch.full((b,), prefix.numel(), device=dev)}
    total = 0.0
    for _ in range(rounds):
        out = bd3_nelbo(model, batch, block_size, generator=generator, fixed_t=1.0 if exact else None)
        total += float(out.total) / b
    return -total / rounds


class DiffusionEvalLM(LM):
    """Shared lm-eval plumbing. Subclasses set ``model``, ``tokenizer``, ``bd3`` before calling
    ``__init__`` and implement ``score(prefix, target) -> float`` and ``greedy(prefix, target)``.
    ``call(model, input_ids, attention_mask, generator)`` decodes a batch (:func:`dlm.spec.generate`)."""

    def __init__(self, strategy: Sampler, batch_size=1, mc_num: int = 128,
                 mc_batch_size: int = 32, check_greedy: bool = True, seed: int = 0, truncate: str = "no") -> None:
        super().__init__()
        if truncate not in ("no", "left"):
            raise ValueError(f"truncate must be 'no' (refuse an over-long prompt) or 'left', got {truncate!r}")
        self.truncate = truncate
        self.batch_size = _positive("batch_size", batch_size)
        self.mc_num, self.mc_batch_size = _positive("mc_num", mc_num), _positive("mc_batch_size", mc_batch_size)
        if self.mc_num % self.mc_batch_size:
            raise ValueError(f"mc_num={mc_num} must be a multiple of mc_batch_size={mc_batch_size}")
        if not isinstance(check_greedy, bool):
            raise ValueError(f"check_greedy must be true/false, got {check_greedy!r}")
        if not isinstance(strategy, Sampler):
            raise TypeError(f"strategy must be a dlm.spec.Sampler, got {type(strategy).__name__}")
        self.strategy, self.check_greedy, self.seed = strategy, check_greedy, int(seed)
        self.call = lambda model, ids, mask, gen: generate(model, ids, mask, strategy, generator=gen)
        if strategy.gen_length >= self.max_length:
            raise ValueError(f"gen_length={strategy.gen_length} leaves no room for a prompt in "
                             f"max_seq_len={self.max_length}")
        self._device = next(self.model.parameters()).device

    @property
    def max_length(self) -> int:
        return self.model.config.max_seq_len

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def chat_template(self, chat_template=False) -> str:
        return (getattr(self.tokenizer, "chat_template", None) or "") if chat_template else ""

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _start_ids(self) -> list[int]:
        tok = self.tokenizer
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if start is None:
            raise ValueError("an empty context needs a tokenizer with a BOS or EOS token")
        return [start]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context / continuation ids as lm-eval's HF model splits them (trailing context spaces
        move to the continuation); an empty context becomes ``[BOS]``."""
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        enc = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        whole, ctx = enc(context + continuation), enc(context)
        cont = whole[len(ctx):]
        if not cont:
            raise ValueError(f"continuation {continuation!r} encodes to no tokens")
        if len(cont) >= self.max_length:
            raise ValueError(f"continuation of {len(cont)} tokens does not fit max_seq_len={self.max_length}")
        return ctx or self._start_ids(), cont

    def _checked(self, kind: str, requests, texts: list[str], ids: list[list[int]], tails: list[list[int]],
                 after: list[int] | None) -> list[list[int]]:
        """The ``ids`` (+ ``tails``) of ``texts`` checked before the first forward (module docstring);
        each must leave room for its ``after`` tokens (None: any length), or is cut under ``truncate=left``."""
        labels = [f"{r.task_name} doc {r.doc_id}" if r.task_name is not None else f"{kind} request {i}"
                  for i, r in enumerate(requests)]
        mask_id, bad = self.model.config.mask_token_id, {}
        for label, text, x, tail in zip(labels, texts, ids, tails):
            masked, pieces = token_trouble(self.tokenizer, text, x + tail, mask_id)
            if masked:
                raise mask_error(f"lm-eval {kind}", f"the prompt of {label}", self.tokenizer, mask_id)
            if pieces:
                bad.setdefault(label, pieces)
        note = unk_note(f"lm-eval {kind}", bad, len(requests), getattr(self.tokenizer, "unk_token", None))
        if note:
            print(note, file=sys.stderr)
        docs = [(r.task_name, label, r.doc["question"], r.args[0]) for label, r in zip(labels, requests)
                if isinstance(r.doc, dict) and isinstance(r.doc.get("question"), str)]
        for task in dict.fromkeys(d[0] for d in docs):  # within each task: quadratic in its docs
            check_contexts_unseen([d[1:] for d in docs if d[0] == task])
        long = [] if after is None else fit_or_cut(labels, [len(x) for x in ids], after, self.max_length, kind,
                                                   self.truncate == "left")
        return [x[-(self.max_length - after[i]):] if i in long else x for i, x in enumerate(ids)]

    # ---------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Batches of similar prompt length (longest first; :func:`length_batches`), answers in
        request order; the padding share is kept in ``self.padding_waste``."""
        tok, stop = self.tokenizer, stop_ids(self.model)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        prompts = [tok.encode(r.args[0], add_special_tokens=False) or self._start_ids() for r in requests]
        prompts = self._checked("generate_until", requests, [r.args[0] for r in requests], prompts,
                                [[]] * len(prompts), [self.strategy.gen_length] * len(prompts))
        lengths = [len(p) for p in prompts]
        batches = length_batches(lengths, self.batch_size)
        self.padding_waste = padding_waste(lengths, batches)
        out: list[Optional[str]] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="generate_until")
        for idx in batches:
            ids, mask = left_pad([prompts[i] for i in idx], pad)
            gen = torch.Generator(device=self._device).manual_seed(self.seed + min(idx))
            res = self.call(self.model, ids.to(self._device), mask.to(self._device), gen)
            P = ids.shape[1]
            for row, i in enumerate(idx):
                r = requests[i]
                until = r.args[1].get("until", []) if isinstance(r.args[1], dict) else []
                until = [until] if isinstance(until, str) else list(until)
                text = apply_stop_strings(decode_until_stop(tok, res.sequences[row, P:].tolist(), stop), until)
                out[i] = text
                self.cache_hook.add_partial("generate_until", r.args, text)
            bar.update(len(idx))
        bar.close()
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        pairs = [self._encode_pair(*r.args) for r in requests]
        texts = [r.args[0] + r.args[1] for r in requests]
        ctxs = self._checked("loglikelihood", requests, texts, [c for c, _ in pairs], [t for _, t in pairs],
                             [len(t) for _, t in pairs])
        for r, ctx, (_, cont) in zip(tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="loglikelihood"),
                                     ctxs, pairs):
            prefix, target = torch.tensor(ctx, dtype=torch.long), torch.tensor(cont, dtype=torch.long)
            ll = self.score(prefix, target)
            greedy = self.greedy(prefix, target) if self.check_greedy else False
            out.append((ll, bool(greedy)))
            self.cache_hook.add_partial("loglikelihood", r.args, (ll, bool(greedy)))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Sum over consecutive chunks of ``max_seq_len // 2`` tokens, each scored given up to the
        preceding ``max_seq_len // 2`` tokens ([BOS] for the first)."""
        out = []
        half = self.max_length // 2
        texts = [r.args[0] for r in requests]
        every = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        self._checked("loglikelihood_rolling", requests, texts, every, [[]] * len(every), None)  # chunked: any length
        for r, ids in zip(tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="loglikelihood_rolling"), every):
            total = 0.0
            for s in range(0, len(ids), half):
                ctx = ids[max(0, s - half):s] or self._start_ids()
                total += self.score(torch.tensor(ctx), torch.tensor(ids[s:s + half]))
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
        return out


def _load(pretrained, dtype, device):
    """(torch device, torch dtype) of the model args (``dtype``: ``auto`` or a
    :data:`dlm.checkpoints.DTYPES` name, :func:`harness.cli.dtype_of`)."""
    if not pretrained:
        raise ValueError("pretrained=PATH (checkpoint directory or hub id) is required")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():  # lm-eval's CLI defaults to cuda:0
        warnings.warn(f"device={device!r} requested but CUDA is not available; using the CPU")
        dev = torch.device("cpu")
    return dev, dtype_of(dtype, dev)


def _optional_int(value) -> Optional[int]:
    return None if value is None else int(value)


def fastdllm_sampler(strategy: Optional[str], model_args: dict) -> Sampler:
    """The :class:`Sampler` of the ``fastdllm`` model args: a named sampler of the grids (built
    from ``gen_length`` / ``block_length`` / ``steps`` / ``temperature`` / ``family``), or one
    from sampler fields and registered options (:func:`harness.sampler_flags.sampler_from_model_args`)."""
    values = {"gen_length": 256, "block_length": 32, **model_args}
    if strategy is not None:
        numbers = {"threshold": 0.9, "factor": 1.0, "steps": None, "temperature": 0.0, "family": "auto"}
        numbers.update((k, v) for k, v in values.items() if k in (*numbers, "gen_length", "block_length"))
        if set(values) - set(numbers):
            raise ValueError(f"strategy=NAME fixes {', '.join(sorted(set(values) - set(numbers)))}; do not also pass them")
        if strategy not in sampler_names():
            raise ValueError(f"strategy must be a sampler name of harness/grids.py, got {strategy!r}")
        (named,) = resolve([strategy], **numbers)
        sampler = named
    else:
        sampler = sampler_from_model_args(f"fastdllm_{values.get('policy', 'none')}", values)
    if registry.get("policy", sampler.policy).block_model:
        given = f"strategy={strategy}" if strategy is not None else f"policy={sampler.policy}"
        raise ValueError(f"{given}: a block-diffusion sampler needs a BD3-LM model: use the bd3lm model of lm-eval")
    return sampler


#: how to run a checkpoint of each attention with lm-eval (dlm.kind.ModelKind.bind)
RUN_AS = {"block_causal": "use --model bd3lm", "causal": "pass strategy=ar in --model_args",
          "bidirectional": "pass a bidirectional strategy (e.g. strategy=baseline_semiar)"}


@register_model("fastdllm")
class FastDLLMEvalLM(DiffusionEvalLM):
    """Bidirectional model (``dlm.load_model``) decoded by a baseline / Fast-dLLM strategy."""

    def __init__(self, pretrained: str = "", strategy: Optional[str] = None, mc_num: int = 128,
                 mc_batch_size: int = 32, check_greedy: bool = True, batch_size=1, max_batch_size=None,
                 device: Optional[str] = None, dtype: str = "auto", seed: int = 0, truncate: str = "no",
                 **sampler) -> None:
        strat = fastdllm_sampler(strategy, sampler)  # validates before loading
        from dlm.checkpoints import load_model, model_kind

        dev, dt = _load(pretrained, dtype, device)
        with reading("--model_args pretrained=", pretrained):
            self.model, self.tokenizer = load_model(pretrained, dtype=dt, device=dev)
            kind = model_kind(pretrained)
        strat = kind.bind(strat, f"pretrained={pretrained}", RUN_AS)
        if self.tokenizer is None:
            raise ValueError(f"pretrained={pretrained} has no tokenizer files")
        self.bd3 = None
        super().__init__(strat, batch_size, mc_num, mc_batch_size, check_greedy, seed, truncate)

    def score(self, prefix: Tensor, target: Tensor) -> float:
        g = torch.Generator().manual_seed(self.seed)  # mc_loglikelihood draws on the CPU
        return mc_loglikelihood(self.model, prefix, target, self.mc_num, self.mc_batch_size, g)

    def greedy(self, prefix: Tensor, target: Tensor) -> bool:
        from dlm.llada import generate as llada_generate

        L = target.numel()
        out = llada_generate(self.model, prefix[None].to(self._device), gen_length=L, steps=L, block_length=L)
        return bool(torch.equal(out.sequences[0, prefix.numel():].cpu(), target))


@register_model("bd3lm")
class BD3LMEvalLM(DiffusionEvalLM):
    """Block-causal BD3-LM (``bd3lm.BD3LM.load``) decoded with the exact block-causal cache
    (``Sampler(policy="exact")`` with the model's block size and alignment, top-k inside a block,
    SUBS proposals as :func:`bd3lm.sample`)."""

    def __init__(self, pretrained: str = "", gen_length: int = 256, steps: Optional[int] = None,
                 temperature: float = 0.0, stop_at_eos: bool = True, mc_num: int = 128,
                 mc_batch_size: int = 32, check_greedy: bool = True, batch_size=1, max_batch_size=None,
                 device: Optional[str] = None, dtype: str = "auto", seed: int = 0, truncate: str = "no") -> None:
        from bd3lm import BD3LM

        dev, dt = _load(pretrained, dtype, device)
        with reading("--model_args pretrained=", pretrained):
            wrapper, self.tokenizer = BD3LM.load(pretrained, dtype=dt, device=dev)
        if self.tokenizer is None:
            raise ValueError(f"pretrained={pretrained} has no tokenizer files")
        self.model, self.bd3 = wrapper.model.eval(), wrapper.bd3_config
        G = int(gen_length)
        strat = Sampler.of("bd3lm", policy="exact", gen_length=G, block_length=self.bd3.block_size,
                           steps=_optional_int(steps), temperature=float(temperature), top_p=1.0,
                           stop_at_eos=bool(stop_at_eos), align=self.bd3.align)
        super().__init__(strat, batch_size, mc_num, mc_batch_size, check_greedy, seed, truncate)

    def score(self, prefix: Tensor, target: Tensor) -> float:
        g = torch.Generator(device=self._device).manual_seed(self.seed)  # bd3_nelbo draws on the model's device
        return bd3_loglikelihood(self.model, self.bd3.block_size, prefix, target, self.mc_num,
                                 self.mc_batch_size, g)

    def greedy(self, prefix: Tensor, target: Tensor) -> bool:
        from bd3lm import sample

        L, bs = target.numel(), self.bd3.block_size
        G = -(-L // bs) * bs
        out = sample(self.model, prefix[None].to(self._device), block_size=bs, gen_length=G,
                     steps_per_block=bs, stop_at_eos=False, align="prompt")
        return bool(torch.equal(out.sequences[0, prefix.numel():prefix.numel() + L].cpu(), target))


def model_args_help() -> str:
    """The ``--model_args`` of the two models with their defaults (read off the signatures), and
    which tasks fit which checkpoints."""
    lines = ["model_args of this project (comma-separated key=value after --model_args):"]
    for name, cls in (("fastdllm", FastDLLMEvalLM), ("bd3lm", BD3LMEvalLM)):
        params = inspect.signature(cls.__init__).parameters.values()
        args = ", ".join(f"{p.name}={p.default!r}" for p in params if p.name not in ("self", "max_batch_size"))
        lines += textwrap.wrap(f"--model {name}: {args}", 78, initial_indent="  ", subsequent_indent="      ")
    notes = ["strategy=NAME: a name of harness/grids.py (every name: --list-strategies); otherwise any "
             "sampler field (policy, rule, family, gen_length, block_length, steps, stop_at_eos) and any "
             "registered option (the flags of python -m experiments.cli.generate --help); device: cuda when "
             "available, else cpu. truncate='no' refuses a prompt longer than max_seq_len - gen_length, "
             "naming the task and doc; truncate=left keeps its last tokens and warns with the count.",
             "Tasks: the embedded checkpoints (results/checkpoints/) are tiny models of procedural tasks (the "
             "GSM8K-format arithmetic 'arith' and its variants), which lm-eval does not have: score them with "
             "python -m experiments.eval.gsm8k (its default --data arith). --tasks gsm8k is real GSM8K from the Hub; "
             "--tasks gsm8k_local --include_path experiments/cli/lm_eval_tasks is real GSM8K read from "
             "../shared/data/gsm8k/*.jsonl. Expect ~0% from the embedded models on either.",
             "lm-eval's own options: python -m experiments.cli.lm_eval_models run --help"]
    wrapped = [line for note in notes for line in ["", *textwrap.wrap(note, 78, break_on_hyphens=False)]]
    return "\n".join(lines + wrapped)


def main(argv: Optional[list[str]] = None) -> None:
    """lm-eval's CLI with ``fastdllm`` and ``bd3lm`` registered. ``--help`` (without an lm-eval
    command such as ``run``) is this project's short help; ``--list-strategies`` lists the
    ``strategy=`` names; ``--device`` defaults to what is available (lm-eval's own default is
    cuda:0, which warns and falls back on a CPU-only machine)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not {"run", "ls", "validate"} & set(argv) and {"-h", "--help", "--list-strategies"} & set(argv):
        p = parser("experiments.cli.lm_eval_models", __doc__, paragraphs=(0, 1, 2), epilog=model_args_help())
        p.usage = "%(prog)s --model fastdllm|bd3lm --model_args K=V,... --tasks TASK [lm-eval options]"
        add_list_flag(p, "--list-strategies", listing, "print every strategy= name and exit")
        p.parse_known_args(argv)  # prints and exits
    from lm_eval.__main__ import cli_evaluate

    if "--device" not in argv:
        argv += ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    run_main(main)
