"""Command line generation: ``python -m dlm.generate --model DIR --prompt "..."``.

Without ``--model`` it uses the embedded checkpoint in ``results/checkpoints/`` when present,
else a tiny random model (so the command always runs, in seconds, on a CPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .checkpoints import load_model
from .sampling import generate

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "results" / "checkpoints" / "llada-arith"


def _tiny_random_model():
    from .model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=128,
                      max_seq_len=256, mask_token_id=63, eos_token_id=2)
    model = Transformer(cfg)
    model.reset_parameters(generator=torch.Generator().manual_seed(0))
    return model.eval(), None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir or hub id (default: embedded model)")
    p.add_argument("--prompt", default="Ann has 12 apples. She buys 7 more. How many apples does Ann have?")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=None, help="default: gen-length (one token per step)")
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)

    if args.model is None and not DEFAULT_MODEL.is_dir():
        model, tok = _tiny_random_model()
        print("[no embedded checkpoint found: using a tiny random model]")
    else:
        model, tok = load_model(args.model or DEFAULT_MODEL, dtype=args.dtype, device=args.device)
    if tok is not None:
        from .tasks.fewshot import format_prompt

        text = format_prompt(args.prompt) if "Question:" not in args.prompt else args.prompt
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    else:
        text = args.prompt
        ids = torch.tensor([[4 + (ord(c) % (model.config.vocab_size - 8)) for c in args.prompt]])
    ids = ids.to(args.device)
    t0 = time.perf_counter()
    out = generate(model, ids, gen_length=args.gen_length, steps=args.steps or args.gen_length,
                   block_length=args.block_length, temperature=args.temperature,
                   remasking=args.remasking, generator=torch.Generator(args.device).manual_seed(args.seed))
    dt = time.perf_counter() - t0
    answer = out.sequences[0, ids.shape[1]:]
    n = int(out.stats.tokens_until_eos[0])
    if tok is not None:
        print(text + tok.decode(answer[:n], skip_special_tokens=True))
    else:
        print("prompt ids:", ids[0].tolist(), "\nanswer ids:", answer.tolist())
    print(f"[{n} tokens until EOS, {out.stats.nfe} forwards, {dt:.2f}s]")


if __name__ == "__main__":
    main()
