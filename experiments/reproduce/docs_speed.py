"""The generated blocks of ``docs/speed.md`` (:mod:`experiments.reproduce.docblocks`): each a
function of the results folder, from the ``speed_*`` jobs' files."""

from __future__ import annotations

from pathlib import Path

from experiments.bench.ratios import fmt
from harness.cli import markdown_table
from harness.results import read_json


def _breakdowns(results: Path) -> dict[str, dict]:
    return {s: read_json(results / "speed" / f"breakdown_{s}.json", "rows", "git_sha", "repeats")
            for s in ("mid", "embedded")}


def _rows(res: dict, path: str) -> list[dict]:
    need = ("kind", "batch", "whole_over_matmuls", "rest_over_whole", "attention_over_rest", "whole_over_gemms",
            "aten_ops", "narrow_over_rest", "compiled")
    for r in res["rows"]:
        missing = [f for f in need if f not in r]
        missing += [f"compiled.{m}.{f}" for m, c in r.get("compiled", {}).items()
                    for f in ("speedup", "argmax_equal", "page_faults_per_call") if f not in c]
        if missing:
            raise ValueError(f"{path}: a row lacks {missing} (rerun the plan job speed_breakdown)")
    return res["rows"]


def speed_forward(results: Path) -> str:
    """Each forward kind whole against its matmuls alone, what the rest is (attention, ops, narrow
    width), and the issue's bar: ``whole / matmuls <= 1.10`` at the mid shape, batch 1."""
    res = _breakdowns(results)
    rows = {s: _rows(r, f"results/speed/breakdown_{s}.json") for s, r in res.items()}
    body = [[m["kind"], m["batch"], *[fmt(r[f]) for r in (m, e) for f in
                                     ("whole_over_matmuls", "attention_over_rest", "whole_over_gemms", "narrow_over_rest")],
             m["aten_ops"]]
            for m, e in zip(rows["mid"], rows["embedded"])]
    lines = markdown_table(["forward", "batch", *[f"{s}: {c}" for s in ("mid", "embedded") for c in
                                                  ("whole / matmuls", "attention / rest", "whole / (matmuls + attention)",
                                                   "narrow / rest")], "aten ops"], body)
    batch1 = [r for r in rows["mid"] if r["batch"] == 1]
    met = [r["kind"] for r in batch1 if r["whole_over_matmuls"]["ci"][1] <= 1.10]
    met_gemms = [r["kind"] for r in batch1 if r["whole_over_gemms"]["ci"][1] <= 1.10]
    shas = sorted({r["git_sha"][:7] for r in res.values()})
    return "\n".join([
        f"From `results/speed/breakdown_mid.json` and `breakdown_embedded.json` (git {', '.join(shas)}; "
        f"{res['mid']['repeats']} interleaved rounds, medians [95% intervals]).", "", *lines, "",
        f"Bar, mid shape, batch 1, whole / matmuls <= 1.10 (the interval's top): met by "
        f"{len(met)} of {len(batch1)} forward kinds{': ' + ', '.join(met) if met else ''}. "
        f"Counting attention's own kernel with the matmuls, whole / (matmuls + attention) <= 1.10: met by "
        f"{len(met_gemms)} of {len(batch1)}{': ' + ', '.join(met_gemms) if met_gemms else ''}."])


def speed_flop_rate(results: Path) -> str:
    """Time per FLOP of each forward kind at the timing tables' shape: the FLOP ideal charges every
    FLOP alike, so a row whose forwards run faster per FLOP than the baseline's beats its ideal."""
    path = results / "speed" / "flop_rate" / "breakdown_embedded.json"
    res = read_json(path, "rows", "git_sha", "prompt_len", "gen_length")
    for r in res["rows"]:
        if "ns_per_flop" not in r:
            raise ValueError(f"{path}: a row lacks 'ns_per_flop' (rerun the plan job speed_flop_rate)")
    rate = {(r["kind"], r["batch"]): 1e3 * r["ns_per_flop"] for r in res["rows"]}
    body = [[r["kind"], r["batch"], r["queries"], f"{rate[r['kind'], r['batch']]:.2f}",
             f"{rate[r['kind'], r['batch']] / rate['full', r['batch']]:.2f}"] for r in res["rows"]]
    lines = [f"From `results/speed/flop_rate/breakdown_embedded.json` (git {res['git_sha'][:7]}; the embedded "
             f"model, prompt {res['prompt_len']}, gen {res['gen_length']}).", "",
             *markdown_table(["forward", "batch", "query columns", "ps per FLOP", "of the full forward's"], body)]
    for b in sorted({r["batch"] for r in res["rows"]}):
        if ("dual", b) in rate:
            lines += ["", f"At batch {b} the full forward costs {rate['full', b] / rate['dual', b]:.2f}x the dual "
                      f"window's time per FLOP: a dual-cache row's timed speed-up over the baseline can sit that "
                      f"far from its FLOP ideal."]
    return "\n".join(lines)


def speed_compiled(results: Path) -> str:
    """Eager / compiled per forward kind, static and dynamic shapes, and the argmax check."""
    res = _breakdowns(results)
    rows = {s: _rows(r, f"results/speed/breakdown_{s}.json") for s, r in res.items()}
    modes = list(rows["mid"][0]["compiled"])
    if not modes:
        return "Not timed: `results/speed/breakdown_*.json` was written without `--compile`."
    body = []
    for m, e in zip(rows["mid"], rows["embedded"]):
        cells = [fmt(r["compiled"][mode]["speedup"]) + ("" if r["compiled"][mode]["argmax_equal"] else " (argmax differs)")
                 for r in (m, e) for mode in modes]
        body.append([m["kind"], m["batch"], *cells])
    heads = [f"{s}: {mode}" for s in ("mid", "embedded") for mode in modes]
    every = [r for rs in rows.values() for r in rs]
    spans = {mode: [r["compiled"][mode]["speedup"]["median"] for r in every] for mode in modes}
    best = max(modes, key=lambda mode: min(spans[mode]))
    equal = all(r["compiled"][mode]["argmax_equal"] for r in every for mode in modes)
    return "\n".join([
        "Eager time / compiled time of the same forward (>1: compiling wins), from the same files.", "",
        *markdown_table(["forward", "batch", *heads], body), "",
        "Page faults per call, compiled against eager (a compiled forward that copied the cache buffer faulted "
        "in fresh pages on every call): compiled calls faulting over 100 pages more than eager: " + (", ".join(
            f"{r['kind']} batch {r['batch']} {mode} ({c['compiled']:.0f} vs {c['eager']:.0f})"
            for r in every for mode in modes for c in [r["compiled"][mode]["page_faults_per_call"]]
            if c["compiled"] is not None and c["eager"] is not None and c["compiled"] > c["eager"] + 100) or "none") + ".",
        "Medians over the forward kinds, shapes and batches: " + "; ".join(
            f"{mode} {min(v):.2f}x to {max(v):.2f}x" for mode, v in spans.items()) + ".",
        f"Bar, compiled >= 1.0x eager on every forward kind: {'met' if min(spans[best]) >= 1.0 else 'not met'} "
        f"by any mode (the closest, {best}, reaches {min(spans[best]):.2f}x at worst); argmax equal to eager's "
        f"{'in every row' if equal else 'NOT in every row'}."])


def speed_bd3lm(results: Path) -> str:
    """BD3-LM's exact cache against its FLOP and matmul ideals, and the training step against MDLM."""
    path = results / "speed" / "bd3lm.json"
    d = read_json(path, "sampling", "training", "git_sha")
    body = []
    for length, s in sorted(d["sampling"].items(), key=lambda kv: int(kv[0])):
        bound = s["matmul_ideal"]["median"] / s["flop_ideal"]
        body.append([length, fmt(s["speedup"]), f"{s['flop_ideal']:.2f}", fmt(s["of_flop_ideal"]),
                     fmt(s["matmul_ideal"]), f"{bound:.2f}", fmt(s["of_matmul_ideal"]), s["tokens_equal"]])
    train = [[name, t["mode"], fmt(t["ratio"])] for name, t in d["training"].items() if isinstance(t, dict)]
    best = min((t["ratio"]["ci"][1], name) for name, t in d["training"].items()
               if isinstance(t, dict) and t["mode"] == "fwd+bwd")
    return "\n".join([
        f"From `results/speed/bd3lm.json` (git {d['git_sha'][:7]}).", "",
        *markdown_table(["length", "exact cache speed-up", "FLOP ideal", "of FLOP ideal", "matmul ideal",
                         "matmul ideal / FLOP ideal", "of matmul ideal", "tokens equal"], body), "",
        *markdown_table(["training backend", "step", "BD3 / MDLM"], train), "",
        "Bar, exact cache >= 0.6 of its FLOP ideal: " + "; ".join(
            f"length {n}: {'met' if s['of_flop_ideal']['ci'][0] >= 0.6 else 'not met'} ({fmt(s['of_flop_ideal'])}; "
            f"no loop can pass {s['matmul_ideal']['median'] / s['flop_ideal']:.2f} here)"
            for n, s in sorted(d["sampling"].items(), key=lambda kv: int(kv[0]))) + ".",
        f"Bar, training step <= 2.0x MDLM: {'met' if best[0] <= 2.0 else 'not met'} by `{best[1]}` "
        f"(interval top {best[0]:.2f})."])


def speed_ar(results: Path) -> str:
    """The lean AR decoder against its matmul floor and against the general loop."""
    path = results / "speed" / "ar_embedded_g256.json"
    d = read_json(path, "rows", "git_sha")
    body = [[r["batch"], f"{r['seconds']['lean']:.3f}", f"{r['seconds']['matmuls']:.3f}",
             fmt(r["ratios"]["matmuls/lean"]), fmt(r["ratios"]["loop/lean"])] for r in d["rows"]]
    b1 = next(r for r in d["rows"] if r["batch"] == 1)["ratios"]["matmuls/lean"]
    return "\n".join([
        f"From `results/speed/ar_embedded_g256.json` (git {d['git_sha'][:7]}).", "",
        *markdown_table(["batch", "lean s", "matmuls alone s", "matmuls / lean", "loop / lean"], body), "",
        f"Bar, lean AR >= 0.6 of its matmul floor at batch 1: {'met' if b1['ci'][0] >= 0.6 else 'not met'} "
        f"({fmt(b1)})."])


BLOCKS = {fn.__name__: fn for fn in (speed_forward, speed_flop_rate, speed_compiled, speed_bd3lm, speed_ar)}
