"""Automatic upkeep: retention on by default, with a size budget, run by itself once
a period when a store that was written closes, and from the CLI with ``prune --auto``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint import upkeep
from stashpoint.errors import UsageError
from stashpoint.retention import Policy, PrunedError
from stashpoint.verify import verify_store

KIB = 1 << 10


def _value(i: int) -> bytes:
    return os.urandom(64 * KIB)  # incompressible: every checkpoint adds ~64 KiB


def test_sizes_and_tightening_rounds() -> None:
    assert upkeep.parse_size("500M") == 500 << 20
    assert upkeep.parse_size("10GiB") == 10 << 30
    assert upkeep.parse_size("1.5k") == 1536
    assert upkeep.parse_size("4096") == 4096
    with pytest.raises(UsageError):
        upkeep.parse_size("lots")
    rounds = list(upkeep.tightened(Policy.of("7d", 100)))
    assert [p.keep_last for p in rounds] == [50, 25, 12, 6, 3, 1]
    assert all(p.keep_within is None and p.keep_labelled for p in rounds)


def test_over_budget_prunes_oldest_first_and_keeps_heads_and_labels(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s")
    run = store.session("agent")
    cps = [run.checkpoint({"blob": _value(i), "i": i}) for i in range(12)]
    store.meta.set_label(cps[1].id, "agent", "baseline")
    other = store.session("agent", branch="try-b")
    fork = other.checkpoint({"blob": _value(99), "i": 99})
    budget = 6 * 64 * KIB  # about half of what is there
    report = upkeep.run(store, upkeep.Upkeep(Policy.of("7d", 100), budget))
    assert report.rounds >= 1 and not report.over_budget
    assert report.kept_bytes <= budget
    pruned = store.meta.pruned("agent")
    assert cps[-1].id not in pruned and fork.id not in pruned  # branch heads
    assert cps[1].id not in pruned  # labelled
    assert cps[0].id in pruned and cps[2].id in pruned  # the oldest go first
    kept = [c for c in cps if c.id not in pruned]
    assert all(run.state(c)["i"] == c.step - 1 for c in kept)  # kept ones still load
    with pytest.raises(PrunedError):
        run.state(cps[0])
    assert verify_store(store).ok  # pruned records stay: the chain verifies
    store.close()


def test_upkeep_runs_by_itself_when_due_and_only_then(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = stashpoint.open(path)
    upkeep.save(store, upkeep.Upkeep(Policy.of(None, 2), None))
    run = store.session("s")
    for i in range(6):
        run.checkpoint({"i": i})
    store.close()  # the first close of a written store only schedules the first upkeep
    store = stashpoint.open(path)
    assert store.meta.get_meta(upkeep.LAST_META) is not None
    assert store.meta.pruned("s") == {}
    store.close()  # read only: no upkeep either way

    store = stashpoint.open(path)
    store.meta.set_meta(upkeep.LAST_META, repr(time.time() - 2 * 86400))  # a period went by
    store.session("s").checkpoint({"i": 6})
    store.close()
    store = stashpoint.open(path)
    assert len(store.meta.pruned("s")) == 5  # 7 checkpoints, the last 2 kept
    last = float(store.meta.get_meta(upkeep.LAST_META) or 0)
    assert time.time() - last < 600  # rescheduled
    store.close()


def test_upkeep_turned_off_never_runs(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s")
    upkeep.save(store, upkeep.Upkeep(Policy.of(None, 1), None, enabled=False))
    store.meta.set_meta(upkeep.LAST_META, "0")
    run = store.session("s")
    for i in range(3):
        run.checkpoint({"i": i})
    store.close()
    store = stashpoint.open(tmp_path / "s")
    assert store.meta.pruned("s") == {}
    store.close()


def test_cli_save_auto_and_du(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}.bin").write_bytes(os.urandom(100 * KIB))
        sp("snap", "-m", f"s{i}", cwd=ws)
        (ws / f"f{i}.bin").unlink()  # each file lives in one checkpoint only
    saved = json.loads(
        sp("prune", "--save", "--keep-last", "3", "--max-size", "250K", "--json", cwd=ws).out
    )
    assert saved["upkeep"]["max_bytes"] == 250 * KIB and saved["upkeep"]["keep_last"] == 3
    assert json.loads(sp("du", "--json", cwd=ws).out)["upkeep"]["keep_last"] == 3
    dry = json.loads(sp("prune", "--auto", "--dry-run", "--json", cwd=ws).out)
    assert dry["pruned"] == {"main": 2} and dry["dry_run"]
    assert json.loads(sp("log", "--json", cwd=ws).out)[-1]["message"] == "s0"
    done = json.loads(sp("prune", "--auto", "--json", cwd=ws).out)
    assert done["pruned"]["main"] >= 3 and not done["over_budget"]
    assert done["kept_bytes"] <= 250 * KIB
    assert sp("verify", cwd=ws).code == 0
    human = sp("du", cwd=ws).out
    assert "automatic upkeep: last 3 per branch" in human and "250.0 KiB" in human
    sp("prune", "--save", "--off", cwd=ws)
    assert "automatic upkeep: off" in sp("du", cwd=ws).out
    bad = sp("prune", "--max-size", "1M", cwd=ws, check=False)
    assert bad.code == 1 and "--save or --auto" in bad.err


def test_upkeep_that_fails_on_close_logs_a_warning_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    store = stashpoint.open(tmp_path / "s")
    store.session("a").checkpoint({"x": 1})
    store.meta.close()  # its database gone from under it: upkeep cannot even read its policy
    with caplog.at_level(logging.WARNING, logger="stashpoint"):
        assert upkeep.run_if_due(store) is None
    assert f"stashpoint upkeep of {store.url} failed; retried later" in caplog.text


def test_upkeep_whose_gc_fails_is_retried_at_the_next_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upkeep that could not collect (another GC holds the store) stays due: the next close
    runs it, instead of the space staying unfreed for a whole period. Two stores closing at
    once is no failure to warn about."""
    import fcntl
    import logging

    store = stashpoint.open(tmp_path / "s")
    run = store.session("s")
    for i in range(3):
        run.checkpoint({"i": i})
    store.meta.set_meta(upkeep.LAST_META, repr(time.time() - 2 * 86400))  # due
    fd = os.open(tmp_path / "s" / "blobs" / "gc.run", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a `stashpoint gc` of another process, running
        with caplog.at_level(logging.INFO, logger="stashpoint"):
            assert upkeep.run_if_due(store) is None  # not run: logged, no warning
        assert "another stashpoint gc is running" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        os.close(fd)
    assert upkeep.due(store)
    assert upkeep.run_if_due(store) is not None
    assert not upkeep.due(store)
    store.close()


def test_upkeep_leaves_a_leased_session_to_its_holder(tmp_path: Path) -> None:
    """Automatic upkeep prunes every session but one another worker holds a lease on (that
    one's turn comes at the next upkeep); it does not fail on it."""
    with stashpoint.open(tmp_path / "store") as store:
        for name in ("free", "busy"):
            run = store.session(name)
            for i in range(4):
                run.checkpoint({"i": i}, files=False)
        lease = store.lease("busy", owner="worker-a")
        report = upkeep.run(store, upkeep.Upkeep(policy=Policy(None, 1, True)))
        assert report.pruned == {"free": 3}
        assert store.meta.pruned("busy") == {}
        lease.release()
