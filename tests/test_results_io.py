"""Results files that cannot be silently wrong: one writer per file (``results_lock``), strict
loading (repeated ids, corrupt lines, invalid UTF-8 are errors naming file and line), and only a
last line cut short by a crash is dropped."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.results import (REPO, JsonlLog, ResultsLockedError, lock_file_of, merge_logs, read_jsonl,
                                results_lock)

FORK = multiprocessing.get_context("spawn")  # a fresh interpreter: inherits no locks or threads of the test process


def _lines(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# ----------------------------------------------------------------------------- other processes
def _hold(path: str, how: str, ready, release) -> None:
    """Child: hold ``path`` (a JsonlLog, or results_lock) until ``release`` is set."""
    if how == "log":
        log = JsonlLog(path)
        log.append([{"id": "from-child"}])
    else:
        held = results_lock(path)
        held.__enter__()
    ready.set()
    release.wait(30)
    if how == "log":
        log.close()
    else:
        held.__exit__(None, None, None)


@contextmanager
def holder(path: Path, how: str = "log"):
    """A forked process holding ``path`` while the block runs; yields the process."""
    ready, release = FORK.Event(), FORK.Event()
    proc = FORK.Process(target=_hold, args=(str(path), how, ready, release), daemon=True)
    proc.start()
    try:
        assert ready.wait(20), "the holding process did not start"
        yield proc
    finally:
        if proc.is_alive():  # (setting an Event a killed waiter slept on would hang)
            release.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_second_writer_fails_fast_naming_the_holder_then_succeeds(tmp_path):
    path = tmp_path / "baseline_semiar.jsonl"
    with holder(path) as proc:
        t0 = time.monotonic()
        with pytest.raises(ResultsLockedError) as err:
            JsonlLog(path)
        assert time.monotonic() - t0 < 1.0
        msg = str(err.value)
        assert str(path) in msg and f"locked by pid {proc.pid} on host " in msg and " since " in msg
        assert "another run is writing there" in msg and isinstance(err.value, ValueError)
        assert json.loads(lock_file_of(path).read_text())["pid"] == proc.pid
        assert [r["id"] for r in read_jsonl(path)] == ["from-child"]  # readers never lock
    assert proc.exitcode == 0 and not lock_file_of(path).exists()  # a clean close removes the lock file
    with JsonlLog(path) as log:
        log.append([{"id": "from-parent"}])
    assert [r["id"] for r in read_jsonl(path)] == ["from-child", "from-parent"]


def test_lock_of_a_killed_writer_is_taken_over_with_a_note(tmp_path, capfd):
    path = tmp_path / "r.jsonl"
    with holder(path) as proc:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    assert lock_file_of(path).exists()  # left behind; the kernel released its flock
    log = JsonlLog(path)
    err = capfd.readouterr().err
    assert f"taking over {lock_file_of(path)}" in err and f"pid {proc.pid}" in err and "gone" in err
    assert json.loads(lock_file_of(path).read_text())["pid"] == os.getpid()
    log.close()
    assert not lock_file_of(path).exists()


def test_results_lock_on_a_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with results_lock(out) as lock:
        assert lock == (out / ".lock").resolve()
        record = json.loads(lock.read_text())
        assert record["pid"] == os.getpid() and record["host"] and record["since"]
        with results_lock(out):  # re-entrant within one process
            pass
        assert lock.exists()
    assert not (out / ".lock").exists()
    with holder(out, how="lock") as proc:
        with pytest.raises(ValueError, match=f"{out} is locked by pid {proc.pid}"):
            with results_lock(out):
                pass
        with pytest.raises(ValueError, match="locked by"):  # waiting has a limit too
            with results_lock(out, wait=0.2):
                pass
    with results_lock(out):
        pass
    with pytest.raises(ValueError, match="create the directory first"):
        with results_lock(tmp_path / "not-yet"):
            pass


def test_merge_refuses_a_file_another_process_writes(tmp_path):
    path = tmp_path / "m.jsonl"
    with holder(path) as proc:
        with pytest.raises(ValueError, match=f"pid {proc.pid}"):
            merge_logs(path, [])
    assert merge_logs(path, []) == 1


def test_close_and_with_block_release_the_lock(tmp_path):
    path = tmp_path / "r.jsonl"
    with JsonlLog(path) as log:
        log.append([{"id": "a"}])
        assert lock_file_of(path).exists()
    assert not lock_file_of(path).exists()
    with pytest.raises(ValueError, match="closed"):
        log.append([{"id": "b"}])
    assert log.records == [{"id": "a"}]
    JsonlLog(path)  # never closed: released when collected (or at process exit)
    assert not lock_file_of(path).exists()


def test_two_logs_of_one_process_never_duplicate_an_id(tmp_path):
    path = tmp_path / "r.jsonl"
    first, second = JsonlLog(path), JsonlLog(path)
    first.append([{"id": "a", "v": 1}])
    second.append([{"id": "a", "v": 2}, {"id": "b", "v": 3}])
    assert [(r["id"], r["v"]) for r in read_jsonl(path)] == [("a", 1), ("b", 3)]
    assert second.done == {"a", "b"}


def test_shared_logs_append_in_turn(tmp_path):
    """``shared=True``: processes splitting one file (experiments.perplexity) lock per append."""
    path = tmp_path / "r.jsonl"
    one, two = JsonlLog(path, shared=True), JsonlLog(path, shared=True)
    assert not lock_file_of(path).exists()
    one.append([{"id": "config"}])
    two.append([{"id": "config"}, {"id": "train/bd4"}])
    assert [r["id"] for r in read_jsonl(path)] == ["config", "train/bd4"]
    with holder(path) as proc:  # an exclusive writer elsewhere: a shared append gives up, naming it
        with pytest.raises(ValueError, match=f"pid {proc.pid}"):
            JsonlLog(path, shared=True, wait=0.1)


@pytest.mark.slow  # two interpreters
def test_never_closed_log_is_released_at_process_exit(tmp_path):
    """A run in another interpreter that never closes its log: a second writer fails naming it;
    once the first exits (normally), the lock file is gone and the next writer starts cleanly."""
    path = tmp_path / "r.jsonl"
    code = ("import sys; from harness.results import JsonlLog; log = JsonlLog(sys.argv[1]); "
            "log.append([{'id': 'x'}]); print('ready', flush=True); sys.stdin.readline()")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(ValueError, match=f"locked by pid {proc.pid} "):
            JsonlLog(path)
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert proc.returncode == 0 and not lock_file_of(path).exists()
    assert JsonlLog(path).done == {"x"}


# ------------------------------------------------------------------------------ repeated ids
def test_repeated_id_is_an_error_naming_file_id_and_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(_lines({"id": "a", "v": 1}, {"id": "b"}, {"id": "a", "v": 2}))
    before = path.read_bytes()
    for load in (read_jsonl, JsonlLog):
        with pytest.raises(ValueError, match=r"r\.jsonl: id 'a' is repeated \(lines 1 and 3\)"):
            load(path)
    assert path.read_bytes() == before and not lock_file_of(path).exists()


def test_dedupe_keeps_the_first_and_says_how_many_were_dropped(tmp_path, capfd):
    path = tmp_path / "r.jsonl"
    path.write_text(_lines({"id": "a", "v": 1}, {"id": "b"}, {"id": "a", "v": 2}, {"id": "b", "v": 9}))
    assert read_jsonl(path, dedupe=True) == [{"id": "a", "v": 1}, {"id": "b"}]
    assert "dropped 2 repeated-id records" in capfd.readouterr().err
    with JsonlLog(path, dedupe=True) as log:  # a writer also repairs the file
        assert log.records == [{"id": "a", "v": 1}, {"id": "b"}]
    assert read_jsonl(path) == [{"id": "a", "v": 1}, {"id": "b"}]


def test_merge_keeps_first_seen_across_files_but_rejects_repeats_within_one(tmp_path):
    main, r0, r1 = tmp_path / "m.jsonl", tmp_path / "m.rank0.jsonl", tmp_path / "m.rank1.jsonl"
    main.write_text(_lines({"id": "a", "index": 0, "v": "main"}))
    r0.write_text(_lines({"id": "a", "index": 0, "v": "r0"}, {"id": "c", "index": 2}))
    r1.write_text(_lines({"id": "b", "index": 1}))
    assert merge_logs(main, [r0, r1]) == 3
    assert [(r["id"], r.get("v")) for r in read_jsonl(main)] == [("a", "main"), ("b", None), ("c", None)]
    r1.write_text(_lines({"id": "b", "index": 1}, {"id": "d", "index": 3}, {"id": "b", "index": 1}))
    with pytest.raises(ValueError, match=r"m\.rank1\.jsonl: id 'b' is repeated \(lines 1 and 3\)"):
        merge_logs(main, [r0, r1])


# ----------------------------------------------------------------------------- corrupt lines
@pytest.mark.parametrize("bad, why", [
    (b'{"id": "b", "v": \n', "not valid JSON"),
    (b'{"v": 2}\n', "record without an 'id'"),
    (b'{"id": null}\n', "record without an 'id'"),
    (b'[1, 2]\n', "a JSON list where a record"),
    (b'"text"\n', "a JSON str where a record"),
    (b'\n', "empty line"),
])
def test_a_bad_complete_line_is_an_error_naming_file_and_line(tmp_path, bad, why):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": "a"}\n' + bad + b'{"id": "c"}\n')
    before = path.read_bytes()
    for load in (read_jsonl, JsonlLog):
        with pytest.raises(ValueError, match=rf"r\.jsonl: line 2: {why}"):
            load(path)
    assert path.read_bytes() == before  # nothing dropped, nothing recomputed


def test_invalid_utf8_names_file_line_and_byte_offset(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b", "t": "\xff"}\n')
    for load in (read_jsonl, JsonlLog):
        with pytest.raises(ValueError, match=r"r\.jsonl: line 2: invalid UTF-8 at byte offset 30"):
            load(path)


@pytest.mark.parametrize("tail", [b'{"id": "c", "v"', b'{"id": "c"}', b'{"id": "c", "t": "\xc3'])
def test_only_a_last_line_without_newline_is_dropped_with_a_note(tmp_path, capfd, tail):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}\n' + tail)  # killed mid-write
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]
    assert f"{path}: line 3 has no trailing newline" in capfd.readouterr().err
    with JsonlLog(path) as log:  # the writer drops it from the file and resumes
        assert log.done == {"a", "b"}
        log.append([{"id": "b", "v": 99}, {"id": "c", "v": 3}])
    assert "line 3 has no trailing newline" in capfd.readouterr().err
    assert [(r["id"], r.get("v")) for r in read_jsonl(path)] == [("a", None), ("b", None), ("c", 3)]
    assert "no trailing newline" not in capfd.readouterr().err  # repaired


def test_append_checks_its_records(tmp_path):
    with JsonlLog(tmp_path / "r.jsonl") as log:
        with pytest.raises(ValueError, match="'id'"):
            log.append([{"v": 1}])
    assert read_jsonl(tmp_path / "r.jsonl") == [] and read_jsonl(tmp_path / "absent.jsonl") == []


@pytest.mark.slow  # reads every committed results file
def test_committed_results_files_load_strictly():
    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    jsonl = [Path(REPO) / f for f in files if f.endswith(".jsonl")]
    assert jsonl
    for f in jsonl:
        read_jsonl(f)  # raises on a repeated id or a corrupt line
