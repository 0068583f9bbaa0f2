"""What redaction and encryption at rest cost: the same work, four ways.

- state: the conversation workload (each step adds 2 messages of ~500 B and checkpoints
  the whole list, state only) for ``steps`` steps; median per-step latency, on ``memory://``
  (no fsync: on a shared machine the fsync's jitter hides a CPU cost of this size) and on
  SQLite (what users see).
- first snapshot: a fresh ``files``-file workspace, first checkpoint.

- scrub: the redactor alone on each message of the conversation (~500 B of prose each), in
  process CPU time (the load of other processes on a shared machine counts less), per message:
  what redaction adds to each new message of a checkpoint.

Configurations: ``redact=False`` (the floor), redaction on (the default), encryption with
redaction off, and both. Same process, order rotated per repetition; SQLite at its default
``synchronous=FULL``, so the per-step figure includes the commit's fsync, as users see it.
Run: ``python bench/run_all.py --only secrets`` (at most 2,000 files and 500 steps) or
``python bench/bench_secrets.py [--quick]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, median, row
from workload import conversation, make_workspace

KEY = bytes(range(32))
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {"redact": False, "key": None},
    "redact": {"redact": None, "key": None},
    "encrypt": {"redact": False, "key": KEY},
    "redact+encrypt": {"redact": None, "key": KEY},
}


def _state_run(tmp: Path | str, cfg: dict[str, Any], steps: int) -> list[float]:
    pairs = conversation(steps)
    with stashpoint.open(tmp, encryption_key=cfg["key"]) as store:
        run = store.session("bench", redact=cfg["redact"])
        msgs: list[dict[str, Any]] = []
        times = []
        for step, pair in enumerate(pairs):
            msgs = [*msgs, *pair]
            t0 = time.perf_counter()
            run.checkpoint({"messages": msgs, "step": step, "plan": ["a", "b", "c"]})
            times.append(time.perf_counter() - t0)
    return times


def _first_snapshot(tmp: Path, ws: Path, cfg: dict[str, Any]) -> float:
    with stashpoint.open(tmp, encryption_key=cfg["key"]) as store:
        run = store.session("bench", workspace=ws, redact=cfg["redact"])
        t0 = time.perf_counter()
        run.checkpoint()
        return time.perf_counter() - t0


def _scrub_us(steps: int, fresh: bool = False) -> list[float]:
    """CPU microseconds per message for the redactor alone, one sample per pass; ``fresh``:
    a new redactor per pass (each message seen for the first time, as when it is added),
    else the same one (a later checkpoint holding the message again: remembered clean)."""
    from stashpoint.redact import Redactor

    texts = [m["content"] for pair in conversation(steps) for m in pair]
    r = Redactor()
    r.scrub("warm up: the rules load once per process")
    out = []
    for _ in range(7):
        if fresh:
            r = Redactor()
        t0 = time.process_time()
        for t in texts:
            r.scrub(t)
        out.append((time.process_time() - t0) / len(texts) * 1e6)
    return out


def run(config: Config) -> dict[str, Any]:
    files, steps = min(config.files, 2000), min(config.steps, 500)
    base = Path(tempfile.mkdtemp(prefix="sp-bench-secrets-", dir=config.tmp))
    try:
        ws = base / "ws"
        make_workspace(ws, files)
        step_ms: dict[str, list[float]] = {k: [] for k in CONFIGS}
        mem_ms: dict[str, list[float]] = {k: [] for k in CONFIGS}
        snap_s: dict[str, list[float]] = {k: [] for k in CONFIGS}
        names = list(CONFIGS)
        for rep in range(config.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                d = base / f"{name}-{rep}"
                step_ms[name] += [t * 1000 for t in _state_run(d / "s", CONFIGS[name], steps)]
                mem = _state_run("memory://", CONFIGS[name], steps)
                mem_ms[name] += [t * 1000 for t in mem]
                snap_s[name].append(_first_snapshot(d / "w", ws, CONFIGS[name]))
                shutil.rmtree(d)
        rows = []
        series = [
            (f"state step, memory:// ({steps} steps)", mem_ms, "ms"),
            (f"state step, SQLite ({steps} steps)", step_ms, "ms"),
            (f"first snapshot ({files} files)", snap_s, "s"),
        ]
        for name in names[1:]:
            for figure, samples, unit in series:
                rows.append(
                    row(
                        f"{figure}, {name}",
                        median(samples[name]),
                        unit,
                        peer=median(samples["plain"]),
                        peer_name="redact=False",
                        samples=samples[name],
                    )
                )
        for fresh, figure in ((True, "first sight"), (False, "seen before")):
            scrub = _scrub_us(steps, fresh)
            rows.append(
                row(
                    f"redactor alone, per ~500 B message, {figure} (CPU)",
                    min(scrub),
                    "us",
                    samples=scrub,
                    note="min of 7 passes over every message of the conversation",
                )
            )
        notes = [
            "ratio: each configuration against redact=False; memory:// has no fsync (the CPU "
            "cost alone), SQLite fsyncs every checkpoint (what users see)"
        ]
        return {"name": "secrets", "rows": rows, "notes": notes}
    finally:
        if not config.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    cfg = Config.quick() if "--quick" in sys.argv else Config(files=2000, reps=3, steps=500)
    for r in run(cfg)["rows"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        peer = f"{r['peer']:9.3f}" if r["peer"] is not None else "        -"
        print(f"{r['figure']:<52} {r['stashpoint']:9.3f} {r['unit']:<3} vs {peer}  {ratio}")
