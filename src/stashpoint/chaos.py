"""Recovery testing: run an agent, kill it, resume it, and check it recovered.

"Test recovery by deliberately failing and restoring": each scenario runs the agent command in
a fresh copy of its directory, kills it once - right after its k-th journal append (every step
boundary, k = 1..N) or at a random instant - then runs the same command again, answering
approval pauses when asked to, until it exits 0. A scenario passes when its final output equals
an uninterrupted run's and no call body started again after its result had been journaled (the
engine reports both through ``STASHPOINT_CHAOS_LOG``; see :class:`stashpoint.durable.ChaosHooks`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ChaosReport", "ChaosRun", "run_chaos"]

_IGNORE = shutil.ignore_patterns(".stashpoint", ".git", "__pycache__", ".venv", ".pytest_cache")


@dataclass
class ChaosRun:
    scenario: str
    """``boundary 7`` (killed after the 7th journal append) or ``random 0.231s``."""
    killed: bool = False
    attempts: int = 0
    approvals: int = 0
    in_doubt: int = 0
    """Effects whose outcome the kill left unknown; retried (check their idempotency keys)."""
    same_result: bool = False
    ran_twice: list[str] = field(default_factory=list)
    """Calls whose body started again after their result had been journaled."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.same_result and not self.ran_twice and self.error is None


@dataclass
class ChaosReport:
    command: list[str]
    reference: str
    boundaries: int
    runs: list[ChaosRun]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "ok": self.ok,
            "boundaries": self.boundaries,
            "reference": self.reference,
            "runs": [{**asdict(r), "ok": r.ok} for r in self.runs],
        }

    def summary(self) -> str:
        bad = [r for r in self.runs if not r.ok]
        lines = [f"{len(self.runs) - len(bad)}/{len(self.runs)} runs recovered consistently"]
        for r in bad:
            why = r.error or (
                f"ran twice: {', '.join(r.ran_twice)}" if r.ran_twice else "different result"
            )
            lines.append(f"  {r.scenario}: {why}")
        return "\n".join(lines)


class _Scenario:
    def __init__(
        self,
        command: list[str],
        source: Path,
        work: Path,
        name: str,
        session: str,
        approve: bool,
        timeout: float,
    ) -> None:
        self.command, self.session, self.approve, self.timeout = command, session, approve, timeout
        self.dir = work / name.replace(" ", "-")
        shutil.copytree(source, self.dir, symlinks=True, ignore=_IGNORE)
        self.log = work / f"{name.replace(' ', '-')}.chaos.log"
        self.run = ChaosRun(name)
        self.stderr = ""

    def env(self, kill_at: int = 0) -> dict[str, str]:
        env = dict(os.environ, STASHPOINT_CHAOS_LOG=str(self.log))
        env.pop("STASHPOINT_CHAOS_KILL_AT", None)
        if kill_at:
            env["STASHPOINT_CHAOS_KILL_AT"] = str(kill_at)
        return env

    def attempt(self, *, kill_at: int = 0, kill_after: float | None = None) -> tuple[int, str]:
        self.run.attempts += 1
        proc = subprocess.Popen(
            self.command,
            cwd=self.dir,
            env=self.env(kill_at),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # its own process group: a kill reaches the agent behind a wrapper (`sh -c`, a
            # launcher script, `uv run`) and whatever else the command started, not just
            # the process at the top
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(
                timeout=kill_after if kill_after is not None else self.timeout
            )
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            if kill_after is None:
                raise RuntimeError(f"the agent ran longer than {self.timeout:g} s") from None
        except BaseException:  # Ctrl-C no longer reaches its own session: take it down too
            _kill_group(proc)
            proc.wait()
            raise
        if proc.returncode == -signal.SIGKILL:
            self.run.killed = True
        self.stderr = err
        return proc.returncode, out

    def sp(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "stashpoint", "--session", self.session, *args]
        return subprocess.run(cmd, cwd=self.dir, capture_output=True, text=True, timeout=120)

    def finish(self, code: int, out: str, kill_at: int = 0) -> str:
        """Resume until the agent exits 0; its final output. A boundary kill that a pause
        postponed (the k-th append comes in a later process) stays armed until it fires."""
        for _ in range(50):
            if code == 0:
                return out
            if code != -signal.SIGKILL and not self.decide():
                tail = self.stderr.strip().splitlines()[-3:]
                raise RuntimeError(f"the agent exited {code}: {' / '.join(tail)}")
            code, out = self.attempt(kill_at=0 if self.run.killed else kill_at)
        raise RuntimeError("the agent did not complete after 50 resumes")

    def decide(self) -> bool:
        """Answer a pause (approval or in-doubt effect) if allowed; False if not paused."""
        status = self.sp("resume", "--dry-run", "--json")
        if status.returncode != 0:
            return False
        pending = json.loads(status.stdout).get("pending")
        if pending is None or not self.approve:
            return False
        if pending["kind"] == "approval":
            self.run.approvals += 1
        else:
            self.run.in_doubt += 1
        res = self.sp("approve", "--reason", "stashpoint chaos")
        return res.returncode == 0

    def twice(self) -> list[str]:
        recorded: set[str] = set()
        out: list[str] = []
        if not self.log.exists():
            return out
        for line in self.log.read_text().splitlines():
            kind, slot, _pid, name = line.split(" ", 3)
            if kind == "REC":
                recorded.add(slot)
            elif kind == "EXEC" and slot in recorded:
                out.append(f"#{slot} {name}")
        return out


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group ``proc`` leads (its own session): all of it at once. Only
    while ``proc`` is not reaped yet: until then its pid, the group's id, cannot be reused."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group has exited already
        pass
    except PermissionError:  # pragma: no cover - a member changed its uid: the leader at least
        proc.kill()


def run_chaos(
    command: list[str],
    *,
    source: Path,
    session: str = "main",
    boundaries: bool = True,
    max_boundaries: int = 50,
    random_runs: int = 5,
    seed: int | None = None,
    approve: bool = False,
    timeout: float = 300.0,
    progress: Callable[[ChaosRun], None] | None = None,
) -> ChaosReport:
    """Run the scenarios; see the module docstring."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="stashpoint-chaos-") as tmp:
        work = Path(tmp)
        ref = _Scenario(command, source, work, "reference", session, approve, timeout)
        started = time.monotonic()
        code, out = ref.attempt()
        reference = ref.finish(code, out)
        duration = time.monotonic() - started
        appends = sum(
            1 for line in ref.log.read_text().splitlines() if line.startswith("APP ")
        ) if ref.log.exists() else 0  # fmt: skip
        ks = list(range(1, appends + 1)) if boundaries else []
        if len(ks) > max_boundaries:
            ks = sorted(rng.sample(ks, max_boundaries))
        plans: list[tuple[str, int, float | None]] = [(f"boundary {k}", k, None) for k in ks]
        for _ in range(random_runs):
            t = rng.uniform(0.0, max(duration, 0.05))
            plans.append((f"random {t:.3f}s", 0, t))
        runs = []
        for name, kill_at, kill_after in plans:
            sc = _Scenario(command, source, work, name, session, approve, timeout)
            try:
                code, out = sc.attempt(kill_at=kill_at, kill_after=kill_after)
                final = sc.finish(code, out, kill_at)
                sc.run.same_result = final == reference
                sc.run.ran_twice = sc.twice()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                sc.run.error = str(exc)
            runs.append(sc.run)
            if progress is not None:
                progress(sc.run)
            shutil.rmtree(sc.dir, ignore_errors=True)
        return ChaosReport(list(command), reference, appends, runs)
