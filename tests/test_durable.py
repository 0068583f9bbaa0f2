"""Durable execution through the API: replay, divergence, tasks, ledger, approvals, policy."""

from __future__ import annotations

import asyncio
import http.server
import json
import shlex
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.durable import DivergenceError, StepFailed, ToolRejected


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs, nothing catches it."""


class Agent:
    """A small agent program whose step bodies count their executions."""

    def __init__(self, store: stashpoint.Store, *, crash_at: int | None = None, **kw: Any):
        self.run = store.session("job", **kw)
        self.calls: dict[str, int] = {}
        self.crash_at = crash_at
        self.sent: list[str] = []
        run = self.run

        @run.step
        def think(i: int) -> str:
            self._count(f"think{i}")
            if self.crash_at == i:
                raise Crash
            return f"thought {i}"

        @run.tool(irreversible=True)
        def send(text: str) -> str:
            self.sent.append(text)
            return f"sent:{text}"

        self.think, self.send = think, send

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def main(self) -> list[str]:
        run = self.run
        run.plan([("a", "think twice"), ("b", "send"), ("c", "think again")])
        out = []
        with run.task("a"):
            out += [self.think(1), self.think(2)]
        with run.task("b"):
            out.append(self.send(out[-1]))
        with run.task("c"):
            out.append(self.think(3))
        return out


def test_a_resumed_run_replays_recorded_steps_and_finishes_the_same(
    store: stashpoint.Store,
) -> None:
    first = Agent(store, crash_at=3)
    with pytest.raises(Crash):
        first.run.run(first.main)
    assert first.calls == {"think1": 1, "think2": 1, "think3": 1}
    assert first.sent == ["thought 2"]

    again = Agent(store)  # a new process: fresh counters, same store
    result = again.run.run(again.main)
    assert result.status == "completed"
    assert result.value == ["thought 1", "thought 2", "sent:thought 2", "thought 3"]
    assert again.calls == {"think3": 1}  # only the step that never finished ran again
    assert again.sent == []  # the irreversible tool was replayed from the ledger
    assert result.executed >= 1 and result.replayed >= 4

    tasks = {t.id: t.status for t in again.run.tasks()}
    assert tasks == {"a": "completed", "b": "completed", "c": "completed"}
    head = again.run.head
    assert head is not None and head.status == "completed" and head.journal is not None

    # running the finished program again returns the recorded result without executing
    third = Agent(store)
    assert third.run.run(third.main).value == result.value
    assert third.calls == {} and third.sent == []


def test_a_different_call_at_a_recorded_position_is_a_divergence(store: stashpoint.Store) -> None:
    run = store.session("d")

    @run.step
    def ask(q: str) -> str:
        return q.upper()

    run.run(lambda: [ask("a"), ask("b")])
    run2 = store.session("d")

    @run2.step
    def ask2(q: str) -> str:
        raise AssertionError("must not run")

    ask2.__qualname__ = "x"
    with pytest.raises(DivergenceError, match="call #0"):
        run2.run(lambda: ask2("a"))

    run3 = store.session("d")
    ask3 = run3.step(name=ask.__qualname__)(lambda q: q)
    with pytest.raises(DivergenceError, match="call #1"):
        run3.run(lambda: [ask3("a"), ask3("other")])  # same name, other arguments


def test_step_errors_are_journaled_and_replayed(store: stashpoint.Store) -> None:
    calls: list[str] = []

    class Custom(Exception):
        pass

    def program(run: stashpoint.Session) -> Any:
        @run.step(name="boom")
        def boom() -> None:
            calls.append("boom")
            raise ValueError("bad input")

        @run.step(name="odd")
        def odd() -> None:
            calls.append("odd")
            raise Custom("custom")

        def main() -> list[BaseException]:
            caught = []
            for fn in (boom, odd):
                try:
                    fn()
                except Exception as exc:
                    caught.append(exc)
            return caught

        return main

    run = store.session("e")
    first = run.run(program(run), fresh=True)
    assert [type(e).__name__ for e in first.value] == ["ValueError", "Custom"]
    run2 = store.session("e")
    main2 = program(run2)
    again = run2.run(main2)
    assert calls == ["boom", "odd"]  # not re-executed
    errs = main2()  # replays outside run(): the recorded errors, re-created safely
    assert type(errs[0]) is ValueError and str(errs[0]) == "bad input"
    assert isinstance(errs[1], StepFailed) and "Custom: custom" in str(errs[1])
    assert again.status == "completed"


def test_retries_journal_only_the_final_outcome(store: stashpoint.Store) -> None:
    run = store.session("r")
    attempts = []

    @run.step(retries=2, backoff=0)
    def flaky() -> int:
        attempts.append(1)
        if len(attempts) < 3:
            raise TimeoutError("slow")
        return len(attempts)

    assert run.run(flaky).value == 3
    assert run.run(flaky).value == 3 and len(attempts) == 3  # the same program again


def test_async_steps_replay_by_call_order_even_when_they_finish_out_of_order(
    store: stashpoint.Store,
) -> None:
    executed: list[int] = []

    def make(run: stashpoint.Session) -> Any:
        @run.step
        async def fetch(i: int, delay: float) -> int:
            await asyncio.sleep(delay)
            executed.append(i)
            return i * 10

        async def main() -> list[int]:
            return list(await asyncio.gather(fetch(1, 0.05), fetch(2, 0.0), fetch(3, 0.02)))

        return main

    run = store.session("a")
    res = asyncio.run(run.arun(make(run)))
    assert res.value == [10, 20, 30] and sorted(executed) == [1, 2, 3]
    assert executed != [1, 2, 3]  # they finished out of order
    executed.clear()
    run2 = store.session("a")
    assert asyncio.run(run2.arun(make(run2))).value == [10, 20, 30]
    assert executed == []


def test_async_steps_hand_their_journal_writes_to_a_thread_without_a_task_each(
    store: stashpoint.Store,
) -> None:
    """The fsynced append of an async step runs in a worker thread, tracked (so that a pause
    waits for a sibling's write) by the executor's own future: a task wrapped around each one
    cost every step two more turns of the event loop. The writes still land, in order."""
    run = store.session("no-tasks")
    created: list[Any] = []

    @run.step
    async def noop(i: int) -> int:
        return i

    async def main() -> int:
        loop = asyncio.get_running_loop()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            created.append(coro)
            return asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(factory)
        try:
            return sum([await noop(i) for i in range(20)])
        finally:
            loop.set_task_factory(None)

    res = asyncio.run(run.arun(main))
    assert res.value == sum(range(20)) and res.executed == 20
    assert created == []
    again = store.session("no-tasks")

    @again.step
    async def noop(i: int) -> int:  # noqa: F811 - the same step, on a fresh Session
        return i

    res = asyncio.run(again.arun(main))
    assert res.value == sum(range(20)) and res.replayed == 20


def test_approval_pauses_and_a_decision_applies_once_to_those_arguments(
    store: stashpoint.Store,
) -> None:
    deployed: list[str] = []

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True, approval=True)
        def deploy(env: str) -> str:
            deployed.append(env)
            return f"deployed {env}"

        return lambda: [deploy("prod"), "after"]

    run = store.session("ap")
    res = run.run(program(run))
    assert res.status == "awaiting_approval" and res.pending is not None
    assert res.pending.tool.endswith("deploy") and res.pending.args == [["prod"], {}]
    assert deployed == []
    head = run.head
    assert head is not None and head.status == "awaiting_approval" and head.kind == "paused"
    assert res.pending.checkpoint == head.id

    # resuming without a decision pauses again and takes no new checkpoint
    run2 = store.session("ap")
    assert run2.run(program(run2)).status == "awaiting_approval"
    assert run2.head is not None and run2.head.id == head.id and deployed == []

    decided = store.session("ap").approve(head.id, reason="looks fine", by="ops")
    assert decided.kind == "approval" and decided.meta["decision"]["by"] == "ops"
    with pytest.raises(stashpoint.NotFoundError):  # consumed: nothing pending any more
        store.session("ap").approve()
    run3 = store.session("ap")
    assert run3.run(program(run3)).value == ["deployed prod", "after"]
    assert deployed == ["prod"]
    run4 = store.session("ap")
    assert run4.run(program(run4)).value == ["deployed prod", "after"]
    assert deployed == ["prod"]


def test_a_rejected_tool_raises_in_the_agent(store: stashpoint.Store) -> None:
    def program(run: stashpoint.Session) -> Any:
        @run.tool(approval=True)
        def rm_rf(path: str) -> None:
            raise AssertionError("must not run")

        def main() -> str:
            try:
                rm_rf("/")
            except ToolRejected as exc:
                return f"skipped: {exc.reason}"
            return "ran"

        return main

    run = store.session("rj")
    assert run.run(program(run)).status == "awaiting_approval"
    store.session("rj").reject(reason="too dangerous")
    run2 = store.session("rj")
    assert run2.run(program(run2)).value == "skipped: too dangerous"


def test_a_crash_between_intent_and_outcome_is_surfaced_not_rerun(
    store: stashpoint.Store,
) -> None:
    sent: list[str] = []
    crash = [True]

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True)
        def charge(amount: int) -> str:
            sent.append(str(stashpoint.current_effect_key()))
            if crash[0]:
                raise Crash  # died after the money moved, before the outcome was written
            return f"charged {amount}"

        return lambda: charge(5)

    run = store.session("dbt")
    with pytest.raises(Crash):
        run.run(program(run))
    crash[0] = False
    run2 = store.session("dbt")
    res = run2.run(program(run2))
    assert res.status == "in_doubt" and res.pending is not None and len(sent) == 1
    assert res.pending.id == sent[0]  # the idempotency key
    assert run2.head is not None and run2.head.status == "in_doubt"

    # a human checks: it did happen -> record it; the run goes on without charging again
    store.session("dbt").approve(done=True, result="charged 5 (confirmed by hand)")
    run3 = store.session("dbt")
    assert run3.run(program(run3)).value == "charged 5 (confirmed by hand)"
    assert len(sent) == 1


def test_in_doubt_retry_reuses_the_idempotency_key(store: stashpoint.Store) -> None:
    keys: list[str | None] = []
    crash = [True]

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True)
        def post(msg: str) -> str:
            keys.append(stashpoint.current_effect_key())
            if crash[0]:
                raise Crash
            return "posted"

        return lambda: post("hi")

    run = store.session("retry")
    with pytest.raises(Crash):
        run.run(program(run))
    crash[0] = False
    store.session("retry").approve(reason="the API says it never arrived")
    run2 = store.session("retry")
    assert run2.run(program(run2)).value == "posted"
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0] is not None


def test_rewind_past_effects_lists_them_and_compensates_in_reverse(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    refunds: list[tuple[str, int]] = []

    def program(run: stashpoint.Session) -> Any:
        def refund(result: str, amount: int) -> str:
            refunds.append((result, amount))
            return f"refunded {amount}"

        @run.tool(irreversible=True, compensate=refund)
        def charge(amount: int) -> str:
            (ws / f"receipt-{amount}").write_text(str(amount))
            return f"charge-{amount}"

        @run.tool(irreversible=True)
        def email(to: str) -> str:
            return f"mailed {to}"

        def main() -> None:
            charge(1)
            run.checkpoint(label="after-first")
            charge(2)
            email("boss@example.com")
            charge(3)

        return main

    run = store.session("comp", workspace=ws)
    run.run(program(run))
    effects = run.effects(since="after-first")
    assert [(e.tool.rsplit(".", 1)[-1], e.args) for e in effects] == [
        ("charge", [[2], {}]),
        ("email", [["boss@example.com"], {}]),
        ("charge", [[3], {}]),
    ]
    with pytest.warns(stashpoint.StashpointWarning, match="3 irreversible effect") as rec:
        plain = run.rewind("after-first")
    assert "email" in str(rec[0].message) and len(plain.effects) == 3
    assert sorted(p.name for p in ws.iterdir()) == ["receipt-1"]  # files went back
    run.rewind(plain.safety.id)  # undo the rewind: the effects are ahead again

    res = run.rewind("after-first", compensate=True)
    assert refunds == [("charge-3", 3), ("charge-2", 2)]  # newest first; email has none
    assert [c["ok"] for c in res.compensations] == [True, None, True]
    head = run.head
    assert head is not None and head.meta["compensations"][0]["result"] == "refunded 3"


def test_compensation_requested_elsewhere_runs_when_the_program_resumes(
    store: stashpoint.Store,
) -> None:
    refunds: list[int] = []

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True, compensate=lambda r, n: refunds.append(n))
        def charge(n: int) -> str:
            return "ok"

        def main() -> None:
            run.checkpoint(label="start")
            charge(7)

        return main

    run = store.session("later")
    run.run(program(run))
    other = store.session("later")  # like the CLI: no tools registered in this process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = other.rewind("start", compensate=True)
    assert res.compensations == [] and refunds == []
    resumed = store.session("later")
    resumed.run(program(resumed))
    assert refunds == [7]


def test_checkpoint_policy_every_step_records_each_step(store: stashpoint.Store) -> None:
    run = store.session("pol", checkpoint_every="step")
    n = [0]
    run.track(lambda: {"n": n[0]})

    @run.step
    def inc() -> int:
        n[0] += 1
        return n[0]

    run.run(lambda: [inc(), inc(), inc()])
    autos = [c for c in run.history() if c.kind == "auto"]
    assert len(autos) == 3
    assert [run.state(c)["n"] for c in reversed(autos)] == [1, 2, 3]
    with pytest.raises(stashpoint.UsageError, match="policy"):
        store.session("pol", checkpoint_every="sometimes")


def test_rewinding_state_restarts_execution_from_the_target(store: stashpoint.Store) -> None:
    ran: list[int] = []

    def program(run: stashpoint.Session) -> Any:
        @run.step
        def work(i: int) -> int:
            ran.append(i)
            return i

        def main() -> list[int]:
            out = [work(1)]
            run.checkpoint(label="mid")
            out.append(work(2))
            return out

        return main

    run = store.session("rw")
    run.run(program(run))
    assert ran == [1, 2]
    run.rewind("mid")
    run2 = store.session("rw")
    assert run2.run(program(run2)).value == [1, 2]
    assert ran == [1, 2, 2]  # work(1) replayed, work(2) executed again after the target


def test_a_snap_during_a_run_keeps_the_run_alive(store: stashpoint.Store) -> None:
    ran: list[int] = []

    def program(run: stashpoint.Session, crash: bool) -> Any:
        @run.step
        def work(i: int) -> int:
            ran.append(i)
            if crash and i == 2:
                raise Crash
            return i

        return lambda: [work(1), work(2)]

    run = store.session("snap")
    with pytest.raises(Crash):
        run.run(program(run, True))
    store.session("snap").checkpoint(message="a manual snap after the crash")
    run2 = store.session("snap")
    assert run2.run(program(run2, False)).value == [1, 2]
    assert ran == [1, 2, 2]


def test_migrations_upgrade_old_state_and_newer_versions_are_refused(
    store: stashpoint.Store,
) -> None:
    store.session("m", schema_version=1).checkpoint({"name": "x"})
    v3 = store.session(
        "m",
        schema_version=3,
        migrations={1: lambda s: {**s, "tags": []}, 2: lambda s: {**s, "v": 3}},
    )
    assert v3.state() == {"name": "x", "tags": [], "v": 3}
    v3.checkpoint({"name": "y", "v": 3})
    with pytest.raises(stashpoint.SchemaVersionError, match="newer"):
        store.session("m", schema_version=2).state()


def test_forking_before_effects_lists_them(store: stashpoint.Store) -> None:
    run = store.session("fk")

    @run.tool(irreversible=True)
    def post(text: str) -> str:
        return text

    def main() -> None:
        run.checkpoint(label="before")
        post("hello world")

    run.run(main)
    with pytest.warns(stashpoint.StashpointWarning, match=r"1 irreversible.*post\('hello world'\)"):
        other = run.fork("before", "alt")
    assert other.branch == "alt" and other.effects() == []


def test_a_paused_run_resumes_under_a_changed_config_with_a_warning(
    store: stashpoint.Store,
) -> None:
    def program(run: stashpoint.Session) -> Any:
        @run.tool(approval=True)
        def act() -> str:
            return "acted"

        return lambda: act()

    run = store.session("cfg", config={"model": "a"})
    assert run.run(program(run)).status == "awaiting_approval"
    store.session("cfg").approve()
    changed = store.session("cfg", config={"model": "b"})
    with pytest.warns(stashpoint.StashpointWarning, match="different agent configuration"):
        assert changed.run(program(changed)).value == "acted"


def test_resources_are_recreated_in_each_process_by_their_hook(store: stashpoint.Store) -> None:
    made: list[str] = []

    def program(run: stashpoint.Session, crash: bool) -> Any:
        @run.resource("db")
        def connect() -> dict[str, str]:
            made.append("db")
            return {"dsn": "sqlite://"}

        @run.step
        def query(sql: str) -> str:
            if crash:
                raise Crash
            return f"{run.get_resource('db')['dsn']}: {sql}"

        return lambda: [run.get_resource("db") is run.get_resource("db"), query("select 1")]

    first = store.session("res")
    with pytest.raises(Crash):
        first.run(program(first, True))
    second = store.session("res")  # a new process: the connection is made again, once
    assert second.run(program(second, False)).value == [True, "sqlite://: select 1"]
    assert made == ["db", "db"]
    with pytest.raises(stashpoint.NotFoundError, match="no resource 'cache'"):
        second.get_resource("cache")


def _gated(run: stashpoint.Session) -> Any:
    @run.tool(name="wire", irreversible=True, approval=True)
    def wire(amount: int, to: str) -> str:
        return "wired"

    return lambda: wire(250, to="ACME")


def test_a_pause_notifies_a_command_with_what_and_how_to_approve(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    got = tmp_path / "notified.json"
    script = f"import sys, pathlib; pathlib.Path({str(got)!r}).write_text(sys.stdin.read())"
    run = store.session("n", notify=f"{sys.executable} -c {shlex.quote(script)}")
    res = run.run(_gated(run))
    assert res.status == "awaiting_approval"
    for _ in range(200):  # the command runs detached: wait for it
        if got.exists() and got.read_text():
            break
        time.sleep(0.02)
    doc = json.loads(got.read_text())
    assert doc["event"] == "awaiting_approval" and doc["tool"] == "wire"
    assert doc["summary"] == "wire(250, to='ACME')"
    assert doc["checkpoint"] == res.pending.checkpoint  # type: ignore[union-attr]
    assert doc["approve"].endswith(f"--session n approve {doc['checkpoint']}")
    assert "@" in doc["requested_by"]
    # the approve command it suggests works as printed
    argv = shlex.split(doc["approve"])
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_webhook_gets_the_pause_and_a_failing_notifier_never_blocks(
    store: stashpoint.Store,
) -> None:
    received: list[dict[str, Any]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = store.session("w", notify=f"http://127.0.0.1:{server.server_address[1]}/hook")
        assert run.run(_gated(run)).status == "awaiting_approval"
        assert received and received[0]["tool"] == "wire"
    finally:
        server.shutdown()
        server.server_close()

    for broken in ("/nonexistent/notifier --x", "http://127.0.0.1:9/unreachable"):
        name = "b" + str(abs(hash(broken)))
        run = store.session(name, notify=broken)
        assert run.run(_gated(run)).status == "awaiting_approval"  # paused all the same
    assert store.home is not None
    logged = (store.home / "notify.log").read_text()
    assert "/nonexistent/notifier" in logged and "unreachable" in logged


def test_long_steps_are_checkpointed_at_an_interval(store: stashpoint.Store) -> None:
    run = store.session("iv", checkpoint_interval=0.05)
    progress = {"rows": 0}
    run.track(lambda: dict(progress))

    @run.step
    def crunch() -> int:
        for _ in range(6):
            progress["rows"] += 100
            time.sleep(0.05)
        return progress["rows"]

    run.run(crunch)
    during = [c for c in run.history() if "running" in (c.message or "")]
    assert len(during) >= 2  # at least two ticks in ~0.3 s (machines are slow: no upper bound)
    rows = [run.state(c)["rows"] for c in reversed(during)]
    assert rows == sorted(rows) and 0 < rows[0] < 600


def test_a_tampered_journal_is_detected_by_verify_and_on_resume(tmp_path: Path) -> None:
    import sqlite3

    from stashpoint.verify import verify_store

    store = stashpoint.open(tmp_path / "st")
    run = store.session("t")

    @run.step(name="pay_out")
    def pay_out(n: int) -> int:
        return n

    def main() -> int:
        total = pay_out(5) + pay_out(6)
        run.checkpoint(label="done")
        return total

    run.run(main)
    head = run.head
    assert head is not None and head.journal is not None
    store.close()
    db = sqlite3.connect(tmp_path / "st" / "store.db")
    (data,) = db.execute(
        "SELECT data FROM messages WHERE log=? AND idx=0", (head.journal.log,)
    ).fetchone()
    forged = bytes(data).replace(b'"r":5', b'"r":500')
    assert forged != bytes(data)
    db.execute("UPDATE messages SET data=? WHERE log=? AND idx=0", (forged, head.journal.log))
    db.commit()
    db.close()

    store = stashpoint.open(tmp_path / "st")
    report = verify_store(store)
    assert not report.ok and any("journal log" in p.message for p in report.problems)
    again = store.session("t")
    again.step(name="pay_out")(lambda n: n)
    with pytest.raises(stashpoint.IntegrityError, match="journal"):
        again.run(lambda: 0)
    store.close()


# -- review 9 -------------------------------------------------------------------------------
def _gathered_gates(run: stashpoint.Session) -> Any:
    @run.tool(name="deploy", approval=True)
    async def deploy(env: str) -> str:
        return "deployed " + env

    async def main() -> list[str]:
        return list(await asyncio.gather(deploy("eu"), deploy("us")))

    return main


def test_concurrent_approval_requests_are_all_pending_and_decided_by_id(
    store: stashpoint.Store,
) -> None:
    from stashpoint.durable import run_status

    run = store.session("gates")
    first = asyncio.run(run.arun(_gathered_gates(run)))
    assert first.status == "awaiting_approval" and first.pending is not None
    assert first.pending.args == [["eu"], {}]
    status = run_status(store.session("gates"))
    store.session("gates").approve(first.pending.id)  # the one the run reported
    assert status["pending"]["id"] == first.pending.id  # the first in call order
    assert [p["args"] for p in status["pending_all"]] == [[["eu"], {}], [["us"], {}]]
    run = store.session("gates")
    second = asyncio.run(run.arun(_gathered_gates(run)))
    assert second.status == "awaiting_approval" and second.pending is not None
    assert second.pending.args == [["us"], {}]
    store.session("gates").approve()  # the only one left
    for _ in range(3):  # the gates come back in any order: the call slots do not depend on it
        run = store.session("gates")
        done = asyncio.run(run.arun(_gathered_gates(run)))
        assert done.status == "completed" and done.value == ["deployed eu", "deployed us"]


def test_an_in_doubt_effect_is_found_when_a_concurrent_step_journaled_after_it(
    store: stashpoint.Store,
) -> None:
    sent: list[str] = []

    def program(run: stashpoint.Session, crash: bool) -> Any:
        started, quick_done = asyncio.Event(), asyncio.Event()

        @run.step
        async def quick() -> str:
            await started.wait()  # journaled after the send's intent
            return "quick"

        @run.tool(irreversible=True)
        async def send(x: str) -> str:
            started.set()
            sent.append(x)
            await quick_done.wait()
            if crash:
                raise Crash  # the process died while the email went out
            return "sent " + x

        async def quick_then_signal() -> str:
            out = await quick()
            quick_done.set()
            return str(out)

        async def main() -> list[str]:
            return list(await asyncio.gather(send("mail"), quick_then_signal()))

        return main

    run = store.session("mail")
    with pytest.raises(Crash):
        asyncio.run(run.arun(program(run, True)))
    run = store.session("mail")
    paused = asyncio.run(run.arun(program(run, False)))
    assert paused.status == "in_doubt" and paused.pending is not None
    assert sent == ["mail"]  # not sent again on a guess
    pending = store.session("mail").pending()
    assert pending is not None and pending.id == paused.pending.id and pending.kind == "in_doubt"
    store.session("mail").approve(paused.pending.checkpoint, done=True, result="sent by hand")
    run = store.session("mail")
    done = asyncio.run(run.arun(program(run, False)))
    assert done.status == "completed" and done.value == ["sent by hand", "quick"]
    assert sent == ["mail"]


def test_a_step_that_calls_steps_replays_without_diverging(store: stashpoint.Store) -> None:
    ran: list[str] = []

    def program(run: stashpoint.Session, crash: bool) -> Any:
        @run.step
        def inner(x: int) -> int:
            ran.append(f"inner{x}")
            return x * 2

        @run.step
        def outer(x: int) -> int:
            ran.append(f"outer{x}")
            return inner(x) + inner(x + 1)

        @run.step
        async def ainner(x: int) -> int:
            ran.append(f"ainner{x}")
            await asyncio.sleep(0)
            return x

        @run.step
        async def aouter(x: int) -> int:
            ran.append(f"aouter{x}")
            a = await ainner(x)
            return a + await ainner(x + 1)

        @run.step
        def after(y: int) -> int:
            ran.append("after")
            if crash:
                raise Crash
            return y + 100

        async def amain() -> list[int]:
            return list(await asyncio.gather(aouter(10), ainner(20), aouter(30)))

        def main() -> list[int]:
            return [after(outer(1)), *asyncio.run(amain()), after(outer(5))]

        return main

    run = store.session("nest")
    with pytest.raises(Crash):
        run.run(program(run, True))
    assert ran == ["outer1", "inner1", "inner2", "after"]
    run = store.session("nest")
    res = run.run(program(run, False))
    assert res.status == "completed"
    assert res.value == [106, 21, 20, 61, 122]
    ran.clear()
    run = store.session("nest")
    again = run.run(program(run, False))  # everything replays, nested calls included
    assert again.value == res.value and ran == [] and again.executed == 0


def test_a_failure_outside_steps_inside_a_task_does_not_block_the_rerun(
    store: stashpoint.Store,
) -> None:
    flaky = [True]

    def program(run: stashpoint.Session) -> Any:
        @run.step
        def think(i: int) -> str:
            return f"t{i}"

        def main() -> str:
            run.plan(["a"])
            with run.task("a"):
                x = think(1)
                if flaky[0]:
                    raise ConnectionError("transient, outside a step")
                return str(x + think(2))

        return main

    run = store.session("flaky")
    with pytest.raises(ConnectionError):
        run.run(program(run))
    assert [t.status for t in store.session("flaky").tasks()] == ["failed"]
    flaky[0] = False
    run = store.session("flaky")
    res = run.run(program(run))
    assert res.status == "completed" and res.value == "t1t2"
    assert [t.status for t in store.session("flaky").tasks()] == ["completed"]
    run = store.session("flaky")
    assert run.run(program(run)).value == "t1t2"  # and it replays


def test_a_crash_inside_a_compensation_makes_it_in_doubt_not_run_twice(
    store: stashpoint.Store,
) -> None:
    refunds: list[int] = []
    die = [False]

    def program(run: stashpoint.Session) -> Any:
        def refund(result: str, n: int) -> str:
            refunds.append(n)  # the external undo happened...
            if die[0]:
                raise Crash  # ...and the process died before it was recorded
            return "refunded"

        @run.tool(name="charge", irreversible=True, compensate=refund)
        def charge(n: int) -> str:
            return "charged"

        def main() -> None:
            run.checkpoint(label="start")
            charge(7)

        return main

    run = store.session("undo")
    run.run(program(run))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store.session("undo").rewind("start", compensate=True)  # runs when the program does
    die[0] = True
    run = store.session("undo")
    with pytest.raises(Crash):
        run.run(program(run))
    assert refunds == [7]
    die[0] = False
    run = store.session("undo")
    paused = run.run(program(run))
    assert paused.status == "in_doubt" and refunds == [7]  # not run again on a guess
    assert paused.pending is not None and paused.pending.tool == "compensation of charge"
    pending = store.session("undo").pending()
    assert pending is not None and pending.id == paused.pending.id
    secret = "sk-ant-api03-" + "x7" * 20
    by_hand = f"refunded by hand with {secret}"
    store.session("undo").approve(paused.pending.id, done=True, result=by_hand)
    plans = dict(store.meta.iter_meta("compensate:"))
    assert plans and all(secret not in v for v in plans.values())  # redacted, as the journal
    run = store.session("undo")
    assert run.run(program(run)).status == "completed"
    assert refunds == [7]
    comp = next(c for c in store.session("undo").history() if "compensations" in c.meta)
    assert comp.meta["compensations"][0]["ok"] is True
    assert comp.meta["compensations"][0]["result"].startswith("refunded by hand with [REDACTED")


def test_a_crash_right_after_the_done_entry_still_records_the_final_checkpoint(
    store: stashpoint.Store,
) -> None:
    die = [True]

    def program(run: stashpoint.Session) -> Any:
        state: dict[str, Any] = {"answer": None}

        def provider() -> dict[str, Any]:
            if die[0]:
                raise Crash  # the process died after journaling "done"
            return dict(state)

        run.track(provider)

        @run.step
        def think() -> int:
            return 42

        def main() -> int:
            state["answer"] = think()
            return int(state["answer"])

        return main

    run = store.session("fin")
    with pytest.raises(Crash):
        run.run(program(run))
    assert store.session("fin").head is None
    die[0] = False
    run = store.session("fin")
    assert run.run(program(run)).value == 42
    head = store.session("fin").head
    assert head is not None and head.status == "completed" and head.message == "run completed"
    assert store.session("fin").state() == {"answer": 42}
    run = store.session("fin")
    assert run.run(program(run)).value == 42
    assert len(store.session("fin").history()) == 1  # taken once


def test_an_irreversible_tools_unencodable_result_is_refused_but_stays_in_the_ledger(
    store: stashpoint.Store,
) -> None:
    paid: list[int] = []

    class Receipt:
        def __init__(self, n: int) -> None:
            self.n = n

    def program(run: stashpoint.Session) -> Any:
        @run.tool(name="pay", irreversible=True)
        def pay(amount: int) -> Any:
            paid.append(amount)
            return Receipt(amount)

        def main() -> str:
            return type(pay(5)).__name__

        return main

    run = store.session("pay")
    with pytest.raises(stashpoint.errors.SerializationError, match="pay ran, but its result"):
        run.run(program(run))
    (effect,) = store.session("pay").effects()
    assert effect.tool == "pay" and effect.status == "done" and effect.args == [[5], {}]
    run = store.session("pay")
    with pytest.raises(stashpoint.errors.SerializationError, match="pay ran, but its result"):
        run.run(program(run))  # the same answer on replay, never a dict in its place
    assert paid == [5]  # and it did not happen twice
