"""Where any-order generation wins: AR vs masked diffusion on tasks where the end constrains the
start (Sudoku, Countdown) and on the reversal task (the line after / before a memorised line).

    python -m experiments.eval.anyorder --task sudoku --ar runs/anyorder/sudoku-ar \\
        --mdm runs/anyorder/sudoku-mdm --n 300 --out results/anyorder

Test sets: 4x4 Sudoku from ``../shared/data/reasoning/sudoku`` (``d1_4x4_test_sudoku.csv``),
Countdown with 3 numbers (``countdown/cd3_test.jsonl``), the reversal task's held-out poems
(:mod:`tasks.reversal`, forward and reverse). Rows: the AR model decoded left to right with
its KV cache (``ar``); the diffusion model decoded as pure diffusion (one block, one token per
step, most confident first: ``pure``) and semi-autoregressively (blocks of 8: ``semiar``), and,
with ``--adapted``, the AR model continued as a diffusion model (Dream's recipe) decoded the same
two ways (``dream``, ``dreamsa``), and with ``--arlong`` the AR model continued as AR for the same
extra tokens (``arlong``: the AR row with the adapted model's training budget). The checkers verify answers (a valid grid; a true chain of
equations). Per-sample results go to ``<out>/<task>_<row>.jsonl`` (resumable); ``<out>/table.md``
/ ``table.json`` hold accuracy with Wilson 95% CIs and exact McNemar tests on the shared problems
(each diffusion row vs AR, semi-AR vs pure, the adapted model vs ``arlong``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.checkpoints import load_model, weights_fingerprint
from dlm.sample import stop_ids
from dlm.io import data_root
from tasks import countdown, reversal, sudoku
from tasks.evaluate import decode_until_stop, left_pad, mcnemar_exact, wilson_ci
from harness.cli import check_out, markdown_table, parser, run_main, set_threads
from harness.results import REPO, JsonlLog, atomic_write_text, config_hash, git_sha, read_jsonl, sample_shas
from dlm.spec import Sampler, generate

CHECK = {"sudoku": sudoku.check, "countdown": countdown.check, "reversal_after": reversal.check,
         "reversal_before": reversal.check}
# generation lengths inside the trained row lengths (train_anyorder.RESPONSE_LEN + 0..16 tail)
GEN = {"sudoku": 32, "countdown": 48, "reversal_after": 40, "reversal_before": 40}
ROWS = ("ar", "pure", "semiar", "arlong", "dream", "dreamsa")
MODEL_ROWS = {"ar": ("ar",), "mdm": ("pure", "semiar"), "arlong": ("arlong",), "adapted": ("dream", "dreamsa")}
PAIRED = {"ar": "pure", "pure": "ar", "semiar": "pure", "arlong": "ar", "dream": "arlong", "dreamsa": "dream"}


def test_set(name: str, n: int) -> list:
    """The first ``n`` pairs of a task's test set."""
    if name == "sudoku":
        pairs = sudoku.load(data_root() / "reasoning" / "sudoku" / "d1_4x4_test_sudoku.csv")
    elif name == "countdown":
        pairs = countdown.load(data_root() / "reasoning" / "countdown" / "cd3_test.jsonl")
    else:
        pairs = reversal.test_pairs(reversal.corpus(), name.split("_")[1])
    return pairs[:n]


def strategy(row: str, gen: int) -> Sampler:
    """AR with its KV cache, or LLaDA's low-confidence decoding (one token per step) in one block
    (``pure``, ``dream``) or blocks of 8 (``semiar``, ``dreamsa``), whatever the model's family."""
    if row in ("ar", "arlong"):
        return Sampler.of(row, policy="ar", gen_length=gen, block_length=1, stop_at_eos=True)
    return Sampler.of(row, gen_length=gen, block_length=gen if row in ("pure", "dream") else 8, family="llada")


@torch.no_grad()
def run_row(model, tok, pairs, check, row: str, gen: int, log: JsonlLog, batch_size: int, tags: dict) -> None:
    s = strategy(row, gen)
    stops = stop_ids(model)
    todo = [p for p in pairs if p.id not in log.done]
    for i in range(0, len(todo), batch_size):
        chunk = todo[i:i + batch_size]
        ids, mask = left_pad([tok.encode(p.prompt, add_special_tokens=False) for p in chunk], tok.pad_token_id)
        out = generate(model, ids, mask, s)
        P = ids.shape[1]
        recs = []
        for j, p in enumerate(chunk):
            text = decode_until_stop(tok, out.sequences[j, P:].tolist(), stops)
            recs.append({"id": p.id, "row": row, "prompt": p.prompt, "reference": p.answer, "prediction": text,
                         "correct": bool(check(p, text)), "nfe": int(out.stats.row_nfe[j]), **tags})
        log.append(recs)


def run(args) -> None:
    set_threads(args.threads)
    out = Path(args.out)
    models = {"ar": args.ar, "mdm": args.mdm, **({"arlong": args.arlong} if args.arlong else {}),
              **({"adapted": args.adapted} if args.adapted else {})}
    names = ["reversal_after", "reversal_before"] if args.task == "reversal" else [args.task]
    for kind, path in models.items():
        model, tok = load_model(path, dtype=torch.float32)
        model.eval()
        tags = {"model": str(path), "model_weights": weights_fingerprint(path), "git_sha": git_sha()}
        for name in names:
            pairs = test_set(name, args.n)
            for row in MODEL_ROWS[kind]:
                cfg = {"task": name, "row": row, "n": args.n, "model": str(path), "gen": GEN[name]}
                with JsonlLog(out / f"{name}_{row}.jsonl") as log:
                    run_row(model, tok, pairs, CHECK[name], row, GEN[name], log, args.batch_size,
                            {**tags, "config_hash": config_hash(cfg)})
                print(name, row, "done", flush=True)
    report(out)


def report(out: Path) -> dict:
    tasks = sorted({p.stem.rsplit("_", 1)[0] for p in out.glob("*_*.jsonl")})
    rows, table = [], []
    for name in tasks:
        recs = {r: {x["id"]: x["correct"] for x in read_jsonl(out / f"{name}_{r}.jsonl")}
                for r in ROWS if (out / f"{name}_{r}.jsonl").exists()}
        for r, ok in recs.items():
            k, n = sum(ok.values()), len(ok)
            lo, hi = wilson_ci(k, n)
            vs = PAIRED[r]
            p_val, bc = None, "-"
            if vs in recs:
                shared = [i for i in ok if i in recs[vs]]
                b = sum(recs[vs][i] and not ok[i] for i in shared)
                c = sum(ok[i] and not recs[vs][i] for i in shared)
                p_val, bc = mcnemar_exact(b, c), f"{b}/{c}"
            rows.append({"task": name, "row": r, "n": n, "accuracy": k / max(n, 1), "ci": [lo, hi],
                         "vs": vs, "mcnemar_p": p_val, "discordant": bc})
            table.append([name, r, n, f"{100 * k / max(n, 1):.1f} [{100 * lo + 0.0:.1f}, {100 * hi:.1f}]",
                          vs if p_val is not None else "-", "-" if p_val is None else f"{p_val:.2g} ({bc})"])
    md = ["# Any-order tasks: AR vs masked diffusion, same size, same data, same tokens", "",
          "`ar`: the AR model, left to right with its KV cache; `pure`: the diffusion model, one block, one token "
          "per step (most confident first); `semiar`: the same in blocks of 8; `arlong`: the AR model trained on as AR "
          "for the extra tokens of `dream` / `dreamsa`: the AR model continued as a diffusion model (Dream's recipe), "
          "decoded as `pure` / `semiar`. Answers verified by the task's "
          f"checker; Wilson 95% CI; exact McNemar on the shared problems (b/c: only the other row / only this row "
          f"right). Samples: {sample_shas(out)}.", "",
          *markdown_table(["task", "row", "n", "accuracy % [95% CI]", "paired vs", "McNemar p (b/c)"], table)]
    atomic_write_text(out / "table.md", "\n".join(md) + "\n")
    atomic_write_text(out / "table.json", stable_json(rows, indent=1))
    print("\n".join(md))
    return {"rows": rows}


def main(argv=None) -> None:
    p = parser("experiments.eval.anyorder", __doc__, paragraphs=2)
    p.add_argument("--task", choices=["sudoku", "countdown", "reversal"], help="the task (needs --ar and --mdm)")
    p.add_argument("--ar", metavar="DIR", help="the AR model's checkpoint")
    p.add_argument("--mdm", metavar="DIR", help="the masked-diffusion model's checkpoint")
    p.add_argument("--adapted", metavar="DIR", help="optional: the AR model continued as diffusion (Dream's recipe)")
    p.add_argument("--arlong", metavar="DIR", help="optional: the AR model continued as AR as long")
    p.add_argument("--n", type=int, default=300, help="first N test problems (default 300)")
    p.add_argument("--batch-size", type=int, default=50, metavar="B", help="prompts per call (default 50)")
    p.add_argument("--out", default=str(REPO / "results" / "anyorder"), metavar="DIR",
                   help="results dir (default results/anyorder)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--report-only", action="store_true", help="rebuild table.md / .json from the JSONL")
    a = p.parse_args(argv)
    check_out("--out", a.out)
    if a.report_only:
        report(Path(a.out))
        return
    if not (a.task and a.ar and a.mdm):
        raise ValueError("--task, --ar and --mdm are required (or --report-only)")
    if a.n < 1:
        raise ValueError(f"--n must be >= 1, got {a.n}")
    for flag in ("ar", "mdm", "adapted", "arlong"):
        if getattr(a, flag) is not None and not Path(getattr(a, flag)).is_dir():
            raise ValueError(f"--{flag} {getattr(a, flag)}: not a checkpoint directory")
    run(a)


if __name__ == "__main__":
    run_main(main)
