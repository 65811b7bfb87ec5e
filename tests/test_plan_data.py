"""The reproduction plan as data (experiments/reproduce/plan.toml): its reader fills placeholders
as documented and refuses a bad entry with one line naming the file, the job and the key."""

from pathlib import Path

import pytest

from experiments.reproduce.plan import GSM8K_REPORT, PLAN, plan, read_plan

GOOD = """
[groups]
ROWS = ["a", "b"]

[[job]]
name = "train_m"
module = "experiments.train.train_llada"
args = ["--out", "{work}/m"]
what = "a training"
artefacts = ["{work}/m/model/config.json"]
export = ["{work}/m/model", "{ck}/m"]
cost = 30
training = true

[[job]]
name = "table"
module = "experiments.eval.gsm8k"
args = ["--limit", "{n:300}", "--strategies", "@ROWS", "--model", "{ck}/m", "--out", "{out}/t"]
what = "a table"
tables_in = "t"
samples = ["t/*.jsonl"]
always = true
after_full = ["train_m"]
cost = 60.0
cost_n = 300

[[job]]
name = "headline"
module = "experiments.reproduce.headline"
args = ["--results", "{out}"]
what = "the headline"
artefacts = ["headline.md"]
only_outside_results = true
after_every_eval = true
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def test_placeholders_caps_groups_and_full(tmp_path):
    path = _write(tmp_path, GOOD)
    train, table, head = plan("/o", "/w", limit=16, path=path)
    assert table.args == ("--limit", 16, "--strategies", "a", "b", "--model", "results/checkpoints/m", "--out", "/o/t")
    assert table.artefacts == tuple(f"t/{f}" for f in GSM8K_REPORT)
    assert table.cost_min == pytest.approx(60.0 * 16 / 300) and table.after == ()
    assert train.export == ("/w/m/model", "results/checkpoints/m") and train.training and train.cost_min == 30
    assert head.after == ("table",) and head.artefacts == ("headline.md",) and head.cost_min == 0.1
    _, table, _ = plan("/o", "/w", full=True, path=path)
    assert table.args[1] == 300 and table.args[6] == "/o/checkpoints/m" and table.after == ("train_m",)
    assert plan("results", "/w", path=path)[2].artefacts == ()  # the headline then writes README.md instead
    trained = _write(tmp_path, GOOD.replace('"{ck}/m"]', '"{trained}/runs/m.json"]'))
    assert plan("/o", "/w", path=trained)[0].export == ("/w/m/model", "results/runs/m.json")
    assert plan("/o", "/w", full=True, path=trained)[0].export == ("/w/m/model", "/o/runs/m.json")


@pytest.mark.parametrize("old, new, message", [
    ('cost = 30\n', 'cost = 30\ncosts = 1\n', "job 'train_m': unknown key 'costs'"),
    ('always = true\n', 'always = "yes"\n', "job 'table': 'always' must be bool, got 'yes'"),
    ('cost_n = 300\n', 'cost_n = true\n', "job 'table': 'cost_n' must be int, got True"),
    ('after_full = ["train_m"]', 'after_full = ["train_x"]', "job 'table': 'after' names no job 'train_x'"),
    ('"@ROWS"', '"@COLS"', "job 'table': 'args' splices '@COLS', which [groups] does not define"),
    ('"{out}/t"]', '"{outt}/t"]', "job 'table': unknown placeholder '{outt}' in '{outt}/t'"),
    ('name = "headline"', 'name = "table"', "job 'table': the name is used by 2 jobs"),
    ('what = "a table"\n', '', "job 'table' has no 'what'"),
    ('export = ["{work}/m/model", "{ck}/m"]', 'export = ["{work}/m/model"]', "job 'train_m': 'export' must be"),
    ('after_full = ["train_m"]', 'after_full = ["table"]', "job 'table': 'after' makes a cycle (table -> table)"),
    ('name = "headline"', 'name = "headline"\nafter = ["headline"]', "'after' makes a cycle (headline -> headline)"),
    ('training = true\n', 'training = true\nafter = ["table"]\n', "cycle (train_m -> table -> train_m)"),
    ('[groups]', '[group]', "unknown table(s) ['group']"),
    ('cost = 60.0\n', 'cost = 60.0.0\n', "not valid TOML"),
])
def test_a_bad_entry_names_file_job_and_key(tmp_path, old, new, message):
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ValueError) as e:
        plan("/o", "/w", path=path)
    assert str(e.value).startswith(f"{path}:") and message in str(e.value)


def test_the_committed_plan_reads_and_every_dependency_is_a_job():
    groups, entries = read_plan(PLAN)
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)) > 90
    jobs = plan("/tmp/r", "/tmp/w", limit=16, full=True)
    assert [j.name for j in jobs] == names
    for job in jobs:
        assert all(n in names for n in job.after)
        assert not any("{" in str(a) for a in job.args), job.name  # every placeholder filled
    used = {a[1:] for e in entries for a in e["args"] if isinstance(a, str) and a.startswith("@")}
    assert used == set(groups)  # no group is dead data


def test_anyorder_full_runs_train_at_their_grids_pick():
    """Each full any-order run of the plan (``train_anyorder_full_<task>_<objective>``) trains at the
    LR its grid picked in the committed curves (docs/anyorder_plan.md): the grid's flags, the LR of
    the pick, the 12,000-step cap. It joins the plan only once its grid's runs have all finished. The
    continuations (``train_anyorder_cont_*``: adapted, arlong) start from the full AR run's exported
    model at the full run's LR of their objective, for 4000 steps."""
    import json

    jobs = plan("results", "runs/reproduce")
    flags = {j.name: dict(zip(j.args[::2], j.args[1::2])) for j in jobs if j.name.startswith("train_anyorder_")}
    curves = json.loads((Path("results") / "anyorder/curves/curves.json").read_text())
    finished = {r["run"]: r for r in curves["runs"] if r["finished"]}
    full = [n for n in flags if n.startswith("train_anyorder_full_")]
    for name in full:
        f = flags[name]
        grid = {n: g for n, g in flags.items() if n.startswith("train_anyorder_grid_")
                and (g["--task"], g["--objective"]) == (f["--task"], f["--objective"])}
        assert len(grid) == 3 + (name == "train_anyorder_full_countdown_diffusion"), (name, sorted(grid))  # + edge check
        runs = [Path(g["--out"]).name for g in grid.values()]
        assert set(runs) <= set(finished), f"{name}: its grid has unfinished runs {sorted(set(runs) - set(finished))}"
        pick = finished[curves["picks"][f"{f['--task']} {f['--objective']}, cap 3000"]]
        assert pick["run"] in runs and f["--lr"] == pick["lr"] and f["--steps"] == 12000, name
        same = {k: v for k, v in next(iter(grid.values())).items() if k not in ("--lr", "--steps", "--out")}
        assert {k: v for k, v in f.items() if k not in ("--lr", "--steps", "--out")} == same, name
    assert {"countdown"} <= {flags[n]["--task"] for n in full}
    for name in (n for n in flags if n.startswith("train_anyorder_cont_")):  # Dream's recipe and its AR control
        f = flags[name]
        start = f"train_anyorder_full_{f['--task']}_ar"
        assert f["--init"] == next(j for j in jobs if j.name == start).export[1], name  # its exported model
        assert f["--lr"] == flags[f"train_anyorder_full_{f['--task']}_{f['--objective']}"]["--lr"], name
        assert f["--steps"] == 4000 and f.get("--train-size") == flags[start].get("--train-size"), name
