"""Where any-order generation wins: AR vs masked diffusion on tasks where the end constrains the
start (Sudoku, Countdown) and on the reversal task (the line after / before a memorised line).

    python -m experiments.eval.anyorder --task sudoku --ar runs/anyorder/sudoku-ar \\
        --mdm runs/anyorder/sudoku-mdm --n 300 --out results/anyorder

Test sets: 4x4 Sudoku from ``../shared/data/reasoning/sudoku`` (``d1_4x4_test_sudoku.csv``),
Countdown with 3 numbers (``countdown/cd3_test.jsonl``), the reversal task's held-out poems
(:mod:`tasks.reversal`, forward and reverse; ``<task>_drill``: the reverse questions training asked, about the
drill poems). Rows: the AR model decoded left to right with
its KV cache (``ar``); the diffusion model decoded as pure diffusion (one block, one token per
step, most confident first: ``pure``) and semi-autoregressively (blocks of 8: ``semiar``), and,
with ``--adapted``, the AR model continued as a diffusion model (Dream's recipe) decoded the same
two ways (``dream``, ``dreamsa``), and with ``--arlong`` the AR model continued as AR for the same
extra tokens (``arlong``: the AR row with the adapted model's training budget). The checkers verify answers (a valid grid; a true chain of
equations). Per-sample results go to ``<out>/<task>_<row>.jsonl`` (resumable); ``<out>/table.md``
/ ``table.json`` hold accuracy with Wilson 95% CIs and exact McNemar tests on the shared problems
(each diffusion row vs AR, semi-AR vs pure, the adapted model vs ``arlong``).

``--task reversal2`` is the reversal task in its second format (one tokenisation of a line in every
format, :mod:`tasks.reversal`); ``--infill`` adds the infilling probe (:mod:`experiments.eval.infill`,
rows ``<task>_infill_<row>``). The reverse direction is gated: a model whose forward accuracy on the
trained questions (``<task>_after``) is below :data:`GATE` has its ``<task>_before`` row reported as
"did not learn the format", with no test against it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dlm.io import stable_json
from dlm.checkpoints import load_model, weights_fingerprint
from dlm.sample import stop_ids
from tasks import countdown, reversal, sudoku
from tasks.anyorder import kind, test_set
from experiments.eval import infill
from tasks.evaluate import decode_until_stop, left_pad, mcnemar_exact, wilson_ci
from harness.cli import check_out, markdown_table, parser, run_main, set_threads
from harness.noninferiority import newcombe_paired
from harness.results import REPO, JsonlLog, atomic_write_text, config_hash, git_sha, read_jsonl, sample_shas
from dlm.spec import Sampler, generate

CHECK = {"sudoku": sudoku.check, "countdown": countdown.check, "after": reversal.check,
         "before": reversal.check, "drill": reversal.check, "infill": reversal.check}
# generation lengths inside the trained row lengths (tasks.anyorder.RESPONSE_LEN + 0..16 tail); the
# infilling probe's row is its recitation EOS-padded to this many answer columns
GEN = {"sudoku": 32, "countdown": 48, "after": 40, "before": 40, "drill": 40, "infill": 40}
ROWS = ("ar", "pure", "semiar", "arlong", "arfirst", "dream", "dreamsa")
MODEL_ROWS = {"ar": ("ar",), "mdm": ("pure", "semiar"), "arlong": ("arlong",), "ar_first": ("arfirst",),
              "adapted": ("dream", "dreamsa")}
PAIRED = {"ar": "pure", "pure": "ar", "semiar": "pure", "arlong": "ar", "arfirst": "pure", "dream": "arlong",
          "dreamsa": "dream"}
AR_ROWS = ("ar", "arlong", "arfirst")
#: forward accuracy on the trained questions a model needs before its reverse row is scored
GATE = 0.95


def answers(model, tok, pairs, row: str, gen: int) -> list[tuple[str, int]]:
    """Decode ``pairs`` (one batch) as ``row``: per pair the answer text and its forwards."""
    ids, mask = left_pad([tok.encode(p.prompt, add_special_tokens=False) for p in pairs], tok.pad_token_id)
    out = generate(model, ids, mask, strategy(row, gen))
    P, stops = ids.shape[1], stop_ids(model)
    return [(decode_until_stop(tok, out.sequences[j, P:].tolist(), stops), int(out.stats.row_nfe[j]))
            for j in range(len(pairs))]


def strategy(row: str, gen: int) -> Sampler:
    """AR with its KV cache, or LLaDA's low-confidence decoding (one token per step) in one block
    (``pure``, ``dream``) or blocks of 8 (``semiar``, ``dreamsa``), whatever the model's family."""
    if row in AR_ROWS:
        return Sampler.of(row, policy="ar", gen_length=gen, block_length=1, stop_at_eos=True)
    return Sampler.of(row, gen_length=gen, block_length=gen if row in ("pure", "dream") else 8, family="llada")


def eval_fn(tok, task: str, objective: str, sets: dict[str, list], batch_size: int = 50):
    """``eval_fn(model) -> {metric: accuracy}`` for :func:`dlm.train.train`: the held-out sets
    ``sets`` (:func:`tasks.anyorder.heldout`) decoded as the table decodes them (``ar`` for the AR
    objective, ``pure`` for diffusion), scored by the task's checker."""
    row = "ar" if objective == "ar" else "pure"
    poems = reversal.corpus()

    def evaluate(model) -> dict:
        out = {}
        for metric, pairs in sets.items():
            k = {"accuracy": "after"}.get(metric, metric) if task in reversal.VERSIONS else task
            right = 0
            for i in range(0, len(pairs), batch_size):
                chunk = pairs[i:i + batch_size]
                if k == "infill":
                    filled = infill.fill(model, tok, chunk, poems, reversal.VERSIONS[task], row == "ar", GEN[k])
                    texts = [f["prediction"] for f in filled]
                else:
                    texts = [t for t, _ in answers(model, tok, chunk, row, GEN[k])]
                right += sum(bool(CHECK[k](p, t)) for p, t in zip(chunk, texts))
            out[metric] = right / len(pairs)
        return out

    return evaluate


@torch.no_grad()
def run_row(model, tok, pairs, check, row: str, gen: int, log: JsonlLog, batch_size: int, tags: dict) -> None:
    todo = [p for p in pairs if p.id not in log.done]
    for i in range(0, len(todo), batch_size):
        chunk = todo[i:i + batch_size]
        log.append([{"id": p.id, "row": row, "prompt": p.prompt, "reference": p.answer, "prediction": text,
                     "correct": bool(check(p, text)), "nfe": nfe, **tags}
                    for p, (text, nfe) in zip(chunk, answers(model, tok, chunk, row, gen))])


def run_infill_row(model, tok, pairs, version: str, row: str, log: JsonlLog, batch_size: int, tags: dict) -> None:
    """The infilling probe as ``row``: an AR row fills left to right, a diffusion row from both sides."""
    todo = [p for p in pairs if p.id not in log.done]
    poems = reversal.corpus()
    for i in range(0, len(todo), batch_size):
        chunk = todo[i:i + batch_size]
        filled = infill.fill(model, tok, chunk, poems, version, row in ("ar", "arlong"), GEN["infill"])
        log.append([{"id": p.id, "row": row, "prompt": p.prompt, "reference": p.answer, **f,
                     "correct": bool(reversal.check(p, f["prediction"])), **tags} for p, f in zip(chunk, filled)])


def run(args) -> None:
    set_threads(args.threads)
    out = Path(args.out)
    models = {"ar": args.ar, "mdm": args.mdm, **{k: getattr(args, k) for k in ("arlong", "ar_first", "adapted")
                                                  if getattr(args, k)}}
    names = [args.task]
    if args.task in reversal.VERSIONS:
        names = [f"{args.task}_{k}" for k in ("after", "before", "drill", *(("infill",) if args.infill else ()))]
    for model_kind, path in models.items():
        model, tok = load_model(path, dtype=torch.float32)
        model.eval()
        tags = {"model": str(path), "model_weights": weights_fingerprint(path), "git_sha": git_sha()}
        for name in names:
            pairs = test_set(name, args.n)
            for row in MODEL_ROWS[model_kind][:1] if kind(name) == "infill" else MODEL_ROWS[model_kind]:
                gen = GEN[kind(name)]
                cfg = {"task": name, "row": row, "n": args.n, "model": str(path), "gen": gen}
                with JsonlLog(out / f"{name}_{row}.jsonl") as log:
                    row_tags = {**tags, "config_hash": config_hash(cfg)}
                    if kind(name) == "infill":
                        run_infill_row(model, tok, pairs, reversal.VERSIONS[args.task], row, log, args.batch_size,
                                       row_tags)
                    else:
                        run_row(model, tok, pairs, CHECK[kind(name)], row, gen, log, args.batch_size, row_tags)
                print(name, row, "done", flush=True)
    report(out)


def gated(name: str, row: str, recs: dict, forward: dict) -> float | None:
    """The forward accuracy of a ``<task>_before`` row's model when it is below :data:`GATE`
    (0.0 when the model has no forward row), else None: the row is scored."""
    if kind(name) != "before":
        return None
    ok = forward.get(row, {})
    acc = sum(ok.values()) / len(ok) if ok else 0.0
    return acc if acc < GATE else None


def fact(item_id: str) -> str:
    """The fact a reversal question is about, shared by its two directions: ``reversal-after-p-j``
    asks line j + 1 of poem p from line j, ``reversal-before-p-j`` line j from line j + 1."""
    parts = item_id.split("-")
    if len(parts) != 4 or parts[0] != "reversal":
        raise ValueError(f"{item_id!r}: not a reversal question id (reversal-<direction>-<poem>-<line>)")
    return "-".join(parts[2:])


def gap(forward: dict, reverse: dict) -> dict:
    """Forward minus reverse accuracy of one model on the facts asked both ways, in points, with
    Newcombe's paired 95% CI (the two questions about a fact are its paired outcomes)."""
    fwd, rev = {fact(i): v for i, v in forward.items()}, {fact(i): v for i, v in reverse.items()}
    both = [(fwd[f], rev[f]) for f in fwd if f in rev]
    a, b, c = sum(x and y for x, y in both), sum(x and not y for x, y in both), sum(y and not x for x, y in both)
    diff, lo, hi = newcombe_paired(a, b, c, len(both) - a - b - c)  # reverse - forward
    return {"facts": len(both), "gap_pp": -100 * diff, "gap_ci_pp": [-100 * hi, -100 * lo]}


def gap_table(rows: list[dict]) -> list[str]:
    """The reversal gaps of a table's rows as Markdown lines (none when no row has one)."""
    gaps = [[r["task"].rsplit("_", 1)[0], r["row"], r["facts"], f"{r['gap_pp']:.1f} [{r['gap_ci_pp'][0]:.1f}, "
             f"{r['gap_ci_pp'][1]:.1f}]"] for r in rows if "gap_pp" in r]
    return ["", "The reversal gap: forward minus reverse accuracy of each model past the forward gate, on the "
            "facts asked both ways (points; Newcombe's paired 95% CI).", "",
            *markdown_table(["task", "row", "facts", "gap [95% CI]"], gaps)] if gaps else []


def report(out: Path) -> dict:
    tasks = sorted({p.stem.rsplit("_", 1)[0] for p in out.glob("*_*.jsonl")})

    def load(name: str) -> dict:
        return {r: {x["id"]: x["correct"] for x in read_jsonl(out / f"{name}_{r}.jsonl")}
                for r in ROWS if (out / f"{name}_{r}.jsonl").exists()}

    rows, table = [], []
    for name in tasks:
        recs = load(name)
        forward = load(name.rsplit("_", 1)[0] + "_after") if kind(name) == "before" else {}
        gate = {r: gated(name, r, recs, forward) for r in recs}
        for r, ok in recs.items():
            k, n = sum(ok.values()), len(ok)
            lo, hi = wilson_ci(k, n)
            vs = PAIRED[r]
            if gate[r] is not None:
                rows.append({"task": name, "row": r, "n": n, "gated": True, "forward_accuracy": gate[r]})
                table.append([name, r, n, f"did not learn the format (forward {100 * gate[r]:.1f} < {100 * GATE:.0f})",
                              "-", "-"])
                continue
            p_val, bc = None, "-"
            if vs in recs and gate[vs] is None:
                shared = [i for i in ok if i in recs[vs]]
                b = sum(recs[vs][i] and not ok[i] for i in shared)
                c = sum(ok[i] and not recs[vs][i] for i in shared)
                p_val, bc = mcnemar_exact(b, c), f"{b}/{c}"
            rows.append({"task": name, "row": r, "n": n, "accuracy": k / max(n, 1), "ci": [lo, hi],
                         "vs": vs, "mcnemar_p": p_val, "discordant": bc,
                         **(gap(forward[r], ok) if kind(name) == "before" and r in forward else {})})
            table.append([name, r, n, f"{100 * k / max(n, 1):.1f} [{100 * lo + 0.0:.1f}, {100 * hi:.1f}]",
                          vs if p_val is not None else "-", "-" if p_val is None else f"{p_val:.2g} ({bc})"])
    md = ["# Any-order tasks: AR vs masked diffusion, same size, same data, same tokens", "",
          ("`ar`: the AR model, left to right with its KV cache; `pure`: the diffusion model, one block, one token "
          "per step (most confident first); `semiar`: the same in blocks of 8; `arlong`: the AR model trained on as AR "
          "for the extra tokens of `dream` / `dreamsa`: the AR model continued as a diffusion model (Dream's recipe), "
          "decoded as `pure` / `semiar`; `arfirst`: an AR model of the first recipe (LLaDA's layout, one row length, "
          "1500 steps), decoded as `ar`. Answers verified by the task's "
          f"checker; Wilson 95% CI; exact McNemar on the shared problems (b/c: only the other row / only this row "
          f"right). A reverse (`_before`) row is scored only for a model whose forward accuracy on the trained "
          f"questions (`_after`) is at least {100 * GATE:.0f}%. Samples: {sample_shas(out)}."), "",
          *markdown_table(["task", "row", "n", "accuracy % [95% CI]", "paired vs", "McNemar p (b/c)"], table)]
    md += gap_table(rows)
    atomic_write_text(out / "table.md", "\n".join(md) + "\n")
    atomic_write_text(out / "table.json", stable_json(rows, indent=1))
    print("\n".join(md))
    return {"rows": rows}


def main(argv=None) -> None:
    p = parser("experiments.eval.anyorder", __doc__, paragraphs=2)
    p.add_argument("--task", choices=["sudoku", "countdown", *reversal.VERSIONS],
                   help="the task (needs --ar and --mdm); reversal2: one tokenisation of a line in every format")
    p.add_argument("--ar", metavar="DIR", help="the AR model's checkpoint")
    p.add_argument("--mdm", metavar="DIR", help="the masked-diffusion model's checkpoint")
    p.add_argument("--adapted", metavar="DIR", help="optional: the AR model continued as diffusion (Dream's recipe)")
    p.add_argument("--arlong", metavar="DIR", help="optional: the AR model continued as AR as long")
    p.add_argument("--ar-first", metavar="DIR", help="optional: an AR model of another recipe (row arfirst)")
    p.add_argument("--n", type=int, default=300, help="first N test problems (default 300)")
    p.add_argument("--batch-size", type=int, default=50, metavar="B", help="prompts per call (default 50)")
    p.add_argument("--out", default=str(REPO / "results" / "anyorder"), metavar="DIR",
                   help="results dir (default results/anyorder)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--infill", action="store_true", help="reversal tasks: add the infilling probe's rows")
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
    if a.infill and a.task not in reversal.VERSIONS:
        raise ValueError(f"--infill probes the reversal tasks only, not --task {a.task}")
    for flag in ("ar", "mdm", "adapted", "arlong", "ar_first"):
        if getattr(a, flag) is not None and not Path(getattr(a, flag)).is_dir():
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(a, flag)}: not a checkpoint directory")
    run(a)


if __name__ == "__main__":
    run_main(main)
