"""The web UI's pages over real stores through real HTTP (Starlette's test client): the graph
paged and filtered, the file viewer, the live endpoint, label and edit, the static files under
the CSP, and every page on SQLite, PostgreSQL and Redis stores."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import stashpoint
from stashpoint.webui import create_app
from stashpoint.webui.data import LINES_PER_PAGE
from stashpoint.webui.sessions import PER_PAGE
from tests.test_postgres import pg_url  # noqa: F401 - fixtures
from tests.test_redis import redis_url  # noqa: F401

TOKEN = "p" * 8 + "0123456789abcdef"
BASE = "http://127.0.0.1:8765"
EVIL = "<script>alert(1)</script>"


def _client(store: stashpoint.Store, root: Path | None = None) -> TestClient:
    c = TestClient(
        create_app(store, token=TOKEN, port=8765, root=root), base_url=BASE, follow_redirects=False
    )
    c.get(f"/?token={TOKEN}")
    return c


def _csrf(html: str) -> str:
    found = re.search(r"name='csrf' value='([0-9a-f]+)'", html)
    assert found
    return found.group(1)


def _rows(html: str) -> list[str]:
    return re.findall(r"<tr id='r-([0-9A-Z]+)'>", html)


def test_a_long_session_is_paged_and_filtered(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "store", durability="exit")
    s = store.session("long")
    ids = [s.checkpoint({"n": i}, message=f"step {i}").id for i in range(PER_PAGE * 2 + 5)]
    s.label(ids[7], "the-one")
    s.rewind(ids[3], files=False)  # a safety checkpoint (pre-rewind) and a new head
    c = _client(store)
    first = c.get("/s/long").text
    assert len(_rows(first)) == PER_PAGE and "page=2" in first and ">newer</a>" not in first
    third = c.get("/s/long?page=3").text
    assert len(_rows(third)) == len(ids) + 2 - 2 * PER_PAGE and ">older</a>" not in third
    assert c.get("/s/long?page=9").status_code == 404
    assert _rows(c.get("/s/long?label=the-one").text) == [ids[7]]
    assert _rows(c.get("/s/long?q=STEP 204").text) == [ids[204]]  # text, any case
    safety = [cp.id for cp in s.history() if cp.kind == "pre-rewind"]
    assert _rows(c.get("/s/long?kind=pre-rewind").text) == safety
    folded = _rows(c.get("/s/long?safety=hide&page=3").text)
    assert safety[0] not in folded and folded[-1] == ids[0]
    store.close()


def test_names_messages_and_state_are_escaped_and_no_inline_script_runs(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "store", durability="exit")
    s = store.session("x")
    msgs = [{"role": "user", "content": EVIL}, {"role": "assistant", "content": EVIL}]
    cp = s.checkpoint({"messages": msgs, EVIL: EVIL}, message=EVIL, label=EVIL)
    s.fork(cp.id, "b-" + "x" * 3)
    c = _client(store)
    for path in ("/s/x", f"/s/x/c/{cp.id}", f"/s/x/diff?a={cp.id}&b={cp.id}"):
        r = c.get(path)
        assert r.status_code == 200 and EVIL not in r.text
        assert "<script src='/static/app.js' defer></script>" in r.text
        assert r.text.count("<script") == 1  # only the package's own file
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
    page = c.get(f"/s/x/c/{cp.id}").text
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # chat x2, state, label
    store.close()


def test_static_files_need_the_token_and_are_only_the_packaged_ones(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "store")
    anonymous = TestClient(create_app(store, token=TOKEN, port=8765), base_url=BASE)
    assert anonymous.get("/static/app.js").status_code == 401
    c = _client(store)
    js = c.get("/static/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "live.json" in js.text and "innerHTML" not in js.text  # rows built as text nodes
    assert c.get("/static/app.css").headers["content-type"].startswith("text/css")
    assert ".src .k" in c.get("/static/pygments.css").text  # highlighting by classes
    for bad in ("/static/..%2Fapp.py", "/static/app.py", "/static/%2e%2e"):
        assert c.get(bad).status_code == 404
    store.close()


def test_the_file_viewer_highlights_pages_and_summarises(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return '<b>'\n")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    (root / "<b onclick=x>.txt").write_text("a file name with markup\n")
    (root / "long.txt").write_text("".join(f"line {i}\n" for i in range(LINES_PER_PAGE * 2 + 3)))
    store = stashpoint.open(tmp_path / "store", durability="exit")
    cp = store.session("w", workspace=root).checkpoint({"n": 1})
    c = _client(store, root)
    base = f"/s/w/c/{cp.id}"
    top = c.get(base).text
    assert "?dir=src#files" in top and "blob.bin" in top and "app.py" not in top  # one level
    assert "<b onclick" not in top and "&lt;b onclick=x&gt;.txt" in top
    assert "app.py" in c.get(f"{base}?dir=src").text
    found = c.get(f"{base}?find=APP").text
    assert "path=src%2Fapp.py" in found
    code = c.get(f"{base}/file?path=src/app.py").text
    assert '<span class="k">def</span>' in code and "&lt;b&gt;" in code
    binary = c.get(f"{base}/file?path=blob.bin").text
    assert "binary file" in binary and "300 bytes" in binary
    second = c.get(f"{base}/file?path=long.txt&page=2").text
    assert "page 2 of 3" in second and f"line {LINES_PER_PAGE - 1}\n" not in second
    assert f"{LINES_PER_PAGE + 1}</span>line {LINES_PER_PAGE}\n" in second  # numbered on
    for bad in ("../ws/src/app.py", "src/../../x", "nope.txt", "src"):
        assert c.get(f"{base}/file", params={"path": bad}).status_code == 400
    store.close()


def test_live_endpoint_label_and_edit(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "store", durability="exit")
    s = store.session("run")
    first = s.checkpoint({"plan": {"budget": 5}}, message="one")
    c = _client(store)
    assert c.get(f"/s/run/live.json?after={first.id}").json()["new"] == []
    second = s.checkpoint({"plan": {"budget": 5}}, message="two <i>")
    new = c.get(f"/s/run/live.json?after={first.id}").json()
    assert [r["id"] for r in new["new"]] == [second.id] and new["head"] == second.id
    assert new["new"][0]["message"] == "two <i>"  # data, not markup: the script makes text
    csrf = _csrf(c.get(f"/s/run/c/{second.id}").text)
    r = c.post("/s/run/label", data={"ref": second.id, "label": "good", "csrf": csrf})
    assert r.status_code == 303 and store.session("run").labels()[second.id] == "good"
    assert "label " + second.id + " --delete" in c.get(r.headers["location"]).text  # undo
    form = {"ref": second.id, "path": "plan.budget", "value": "10", "reason": "more", "csrf": csrf}
    r = c.post("/s/run/edit", data=form)
    assert r.status_code == 303
    head = store.session("run").head
    assert head is not None and head.kind == "edit"
    assert store.session("run").state(head)["plan"]["budget"] == 10
    assert "the original" in c.get(r.headers["location"]).text
    refused = c.post("/s/run/edit", data={**form, "ref": first.id})  # older: needs a branch
    assert refused.status_code == 400 and "branch" in refused.text
    assert c.post("/s/run/label", data={"ref": first.id, "label": "x"}).status_code == 403
    store.close()


def test_a_confirmation_page_changes_nothing_and_lists_effects(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    store = stashpoint.open(tmp_path / "store", durability="exit")
    s = store.session("agent", workspace=root)
    (root / "a.txt").write_text("1")
    base = s.checkpoint({"n": 0})

    def program() -> Any:
        @s.tool(irreversible=True)
        def send_mail(to: str) -> str:
            return "sent"

        send_mail("boss@example.com")

    s.run(program)
    (root / "a.txt").write_text("2")
    s.checkpoint({"n": 1})
    before = [cp.id for cp in s.history()]
    c = _client(store, root)
    page = c.get(f"/s/agent/confirm?op=rewind&ref={base.id}&mode=both").text
    assert "Cannot be undone" in page and "boss@example.com" in page and "a.txt" in page
    assert "rewind now" in page and f"1 file(s) in <code>{root}</code>" in page
    fork = c.get(f"/s/agent/confirm?op=fork&ref={base.id}&into={tmp_path / 'b'}").text
    assert "Nothing here changes" in fork and "they stay done" in fork
    assert [cp.id for cp in store.session("agent").history()] == before
    assert (root / "a.txt").read_text() == "2"
    assert c.get(f"/s/agent/confirm?op=drop&ref={base.id}").status_code == 400
    store.close()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_every_page_on_server_stores(kind: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("pg_url" if kind == "postgres" else "redis_url")
    store = stashpoint.open(url)
    s = store.session("srv")
    a = s.checkpoint({"messages": [{"role": "user", "content": "hi"}], "n": 0})
    b = s.checkpoint(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ],
            "n": 1,
        }
    )
    c = _client(store)
    assert "/s/srv" in c.get("/").text
    assert _rows(c.get("/s/srv").text) == [b.id, a.id]
    assert "hello" in c.get(f"/s/srv/c/{b.id}").text
    assert "1 messages added" in c.get(f"/s/srv/diff?a={a.id}&b={b.id}").text
    csrf = _csrf(c.get(f"/s/srv/c/{a.id}").text)
    r = c.post("/s/srv/rewind", data={"ref": a.id, "mode": "state", "csrf": csrf})
    assert r.status_code == 303
    assert store.session("srv").state()["n"] == 0
    store.close()


def test_the_static_files_are_package_data() -> None:
    """An installed wheel serves the same script and styles: each file is in package-data."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parent.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["stashpoint"]
    static = root / "src" / "stashpoint" / "webui" / "static"
    for f in static.iterdir():
        rel = f"webui/static/{f.name}"
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"


def test_a_large_change_is_listed_up_to_a_limit_with_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stashpoint.webui import compare

    root = tmp_path / "ws"
    root.mkdir()
    for i in range(6):
        (root / f"f{i}.txt").write_text(f"file {i}\n")
    store = stashpoint.open(tmp_path / "store", durability="exit")
    s = store.session("big", workspace=root)
    a = s.checkpoint({"n": 0})
    (root / "f0.txt").rename(root / "moved.txt")
    for i in range(1, 6):
        (root / f"f{i}.txt").write_text(f"file {i} changed\n")
    b = s.checkpoint({"n": 1})
    c = _client(store, root)
    page = c.get(f"/s/big/diff?a={a.id}&b={b.id}").text
    assert "renamed" in page and "moved.txt</a> ← f0.txt" in page and "f0.txt</a>" not in page
    assert "6 files changed" in page
    monkeypatch.setattr(compare, "MAX_FILES_SHOWN", 3)
    monkeypatch.setattr(compare, "MAX_DIFF_CHARS", 1)
    cut = c.get(f"/s/big/diff?a={a.id}&b={b.id}").text
    assert "3 more changed files not listed" in cut and "2 more diffs not shown" in cut
    store.close()
