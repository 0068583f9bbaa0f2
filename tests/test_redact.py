"""Redaction: secrets are scrubbed before anything reaches the store.

Values have the real formats of each vendor's keys (the AWS pair is AWS's documented example,
the JWT is jwt.io's, the PEM key is generated here); the store files are read byte for byte to
check that none of them was written, on a store *without* encryption.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stashpoint
from stashpoint.errors import UsageError
from stashpoint.redact import Redactor


def _rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    rnd = os.urandom(n)
    return "".join(alphabet[b % len(alphabet)] for b in rnd)


def _pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwi"
    "aWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def secrets() -> dict[str, str]:
    """name -> a real-format value of that kind (fresh random bodies each run)."""
    return {
        "openai": "sk-proj-" + _rand(48) + "T3BlbkFJ" + _rand(24),
        "openai_legacy": "sk-" + _rand(48),
        "anthropic": "sk-ant-api03-"
        + _rand(93, string.ascii_letters + string.digits + "-_")
        + "AA",
        "aws": "AKIAIOSFODNN7EXAMPLE",
        "github": "ghp_" + _rand(36),
        "github_pat": "github_pat_11A" + _rand(19) + "_" + _rand(59),
        "slack": "xoxb-2400000000-4400000000000-" + _rand(24),
        "google": "AIza" + _rand(35, string.ascii_letters + string.digits + "-_"),
        "jwt": JWT,
        "bearer": _rand(40),
        "private_key": _pem(),
    }


MARKER = {
    "openai_legacy": "openai",
    "github_pat": "github",
}


def test_each_default_pattern_replaces_a_real_value_and_keeps_the_text_around() -> None:
    r = Redactor()
    for name, value in secrets().items():
        text = f"before {value} after"
        if name == "bearer":
            text = f"curl -H 'Authorization: Bearer {value}' https://api.example.com"
        out = r(text)
        assert value not in out, name
        assert f"[REDACTED:{MARKER.get(name, name)}]" in out, (name, out)
        assert out.startswith(("before ", "curl -H 'Authorization: Bearer ")), out
    out = r(f"aws_secret_access_key = {AWS_SECRET}")
    assert out == "aws_secret_access_key = [REDACTED:aws_secret]"


def test_ordinary_text_is_left_alone() -> None:
    r = Redactor()
    text = (
        "The task: refactor sk-learn imports, skip AKIA-style ids, read the Bearer docs, "
        "tokens=512, eyJ is base64 for {, see ghp_ prefix docs; password reset flow."
    )
    assert r(text) is text
    state = {"max_tokens": 512, "token_count": 3, "tokens": ["a", "b"], "passwords_checked": 2}
    assert r(state) is state


def test_nested_state_and_secret_named_keys() -> None:
    s = secrets()
    state: dict[str, Any] = {
        "config": {"db": {"password": "correct horse battery", "host": "db.internal"}},
        "env": [("OPENAI_API_KEY", s["openai"]), ("HOME", "/home/agent")],
        "headers": {"Authorization": "Basic dXNlcjpwYXNz", "Accept": "json"},
        "tools": [{"name": "gh", "args": {"api_key": "plain-looking-value", "repo": "x/y"}}],
        "notes": {f"k{i}": f"deep {s['github']}" for i in range(3)},
        "token": "",  # empty: nothing to hide
        "n": 7,
    }
    frozen = json.dumps(state, sort_keys=True)
    out = Redactor()(state)
    assert json.dumps(state, sort_keys=True) == frozen, "the caller's objects are not mutated"
    assert out["config"]["db"] == {"password": "[REDACTED:field]", "host": "db.internal"}
    assert out["env"] == [("OPENAI_API_KEY", "[REDACTED:openai]"), ("HOME", "/home/agent")]
    assert out["headers"]["Authorization"] == "[REDACTED:field]"
    assert out["tools"][0]["args"] == {"api_key": "[REDACTED:field]", "repo": "x/y"}
    assert out["notes"]["k2"] == "deep [REDACTED:github]"
    assert out["token"] == "" and out["n"] == 7


def _store_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())


def test_nothing_unredacted_reaches_the_sqlite_files(tmp_path: Path) -> None:
    s = secrets()
    values = [*s.values(), AWS_SECRET, "correct horse battery"]
    msgs = [
        {"role": "user", "content": f"my key is {s['anthropic']}, use it"},
        {"role": "tool", "content": f"env: AWS={s['aws']} aws_secret_access_key={AWS_SECRET}"},
    ]
    state = {
        "messages": msgs,
        "creds": {"password": "correct horse battery", "pem": s["private_key"]},
        "seen": [s["openai"], s["openai_legacy"], s["github_pat"], s["slack"], s["google"]],
        "http": f"Authorization: Bearer {s['bearer']} / {s['jwt']}",
    }
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main")
        cp = run.checkpoint(
            state, message=f"saw {s['github']}", meta={"last_header": f"Bearer {s['bearer']}"}
        )
        got = run.state(cp.id)
        assert got["messages"][0]["content"] == "my key is [REDACTED:anthropic], use it"
        assert got["creds"]["password"] == "[REDACTED:field]"
        assert got["creds"]["pem"] == "[REDACTED:private_key]\n"
        assert cp.message == "saw [REDACTED:github]"
        assert cp.meta["stashpoint_redacted"]["field"] == 1
        assert sum(cp.meta["stashpoint_redacted"].values()) >= 12
    assert state["messages"][0]["content"].startswith("my key is sk-ant-")  # not mutated
    raw = _store_bytes(tmp_path / "st")
    for value in values:
        for line in value.splitlines():  # the PEM body, line by line
            if len(line) > 8 and "-----" not in line:
                assert line.encode() not in raw, line[:12]


def test_redaction_off_stores_values_as_given(tmp_path: Path) -> None:
    key = secrets()["openai"]
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main", redact=False)
        run.checkpoint({"k": key})
        assert run.state() == {"k": key}
    assert key.encode() in _store_bytes(tmp_path / "st")  # the control: the grep can fail


def test_a_growing_conversation_keeps_appending_to_one_log(tmp_path: Path) -> None:
    key = secrets()["github"]
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main")
        msgs: list[dict[str, str]] = [{"role": "user", "content": f"token {key}"}]
        first = run.checkpoint({"messages": msgs})
        for i in range(3):
            msgs = [*msgs, {"role": "assistant", "content": f"reply {i}"}]
            last = run.checkpoint({"messages": msgs})
        a, b = first.state.conversation, last.state.conversation
        assert a is not None and b is not None
        assert a.log == b.log and b.length == 4, "redacted history is not seen as edited"
        assert run.state()["messages"][0]["content"] == "token [REDACTED:github]"
        # A new session object (a new process) re-reads the redacted log and still appends.
        again = store.session("main")
        cp = again.checkpoint({"messages": [*again.state()["messages"], {"role": "user"}]})
        assert cp.state.conversation is not None and cp.state.conversation.log == a.log


def test_extra_patterns_callable_and_project_config(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("a", redact={"ticket": r"CORP-[0-9]{6}"})
        assert run.checkpoint({"t": "see CORP-123456"}) and run.state() == {
            "t": "see [REDACTED:ticket]"
        }
        run = store.session("b", redact=lambda v: "gone" if isinstance(v, str) else v)
        run.checkpoint({"t": "anything"})
        assert run.state() == {"t": "anything"}  # the callable sees the whole mapping
        run = store.session("c", redact=lambda v: {k: "gone" for k in v} if v else v)
        run.checkpoint({"t": "anything"})
        assert run.state() == {"t": "gone"}

        (ws / "pyproject.toml").write_text(
            '[tool.stashpoint]\nredact_patterns = { internal = "int-[a-f0-9]{8}" }\n'
        )
        run = store.session("d", workspace=ws)
        run.checkpoint({"t": "int-deadbeef and sk-" + "a" * 30}, files=False)
        assert run.state() == {"t": "[REDACTED:internal] and [REDACTED:openai]"}

        (ws / "pyproject.toml").write_text("[tool.stashpoint]\nredact = false\n")
        run = store.session("e", workspace=ws)
        run.checkpoint({"t": "ghp_" + "b" * 36}, files=False)
        assert run.state() == {"t": "ghp_" + "b" * 36}

        (ws / "pyproject.toml").write_text('[tool.stashpoint]\nredact_patterns = { bad = "(" }\n')
        with pytest.raises(UsageError, match="'bad' is not a valid regex"):
            store.session("f", workspace=ws)


def test_durable_step_results_are_redacted_in_the_journal(tmp_path: Path) -> None:
    key = secrets()["anthropic"]
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("job")

        @run.step
        def fetch() -> dict[str, str]:
            return {"api_key": "x" * 20, "echo": f"ANTHROPIC_API_KEY={key}"}

        def main() -> Any:
            return fetch()

        result = run.run(main)
        assert result.status == "completed"
    assert key.encode() not in _store_bytes(tmp_path / "st")
    with stashpoint.open(tmp_path / "st") as store:  # the replayed result is the redacted one
        run = store.session("job")

        @run.step
        def fetch() -> dict[str, str]:  # the same program, a new process
            raise AssertionError("replayed, not run")

        assert run.run(lambda: fetch()).value == {
            "api_key": "[REDACTED:field]",
            "echo": "ANTHROPIC_API_KEY=[REDACTED:anthropic]",
        }


def test_cli_edit_and_show_see_redacted_state(tmp_path: Path) -> None:
    key = secrets()["slack"]
    ws = tmp_path / "ws"
    ws.mkdir()
    with stashpoint.open(ws / ".stashpoint") as store:
        store.session("main", workspace=ws).checkpoint({"slack": f"xoxb {key}"}, files=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "stashpoint", "show", "--json"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["state"] == {"slack": "xoxb [REDACTED:slack]"}
    assert shown["meta"]["stashpoint_redacted"] == {"slack": 1}


_FIXED = secrets()
_json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=15,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_like, name=st.sampled_from(sorted(_FIXED)))
def test_redaction_is_idempotent_and_finds_secrets_anywhere(value: Any, name: str) -> None:
    r = Redactor()
    secret = _FIXED[name] if name != "bearer" else "Bearer " + _FIXED[name]
    doc = {"payload": value, "deep": [{"text": f"pre {secret} post"}]}
    out = r(doc)
    assert r(out) == out
    assert _FIXED[name] not in json.dumps(out)
    assert out["payload"] == r(value)


def test_dataclasses_and_pydantic_models_are_walked_and_copied() -> None:
    import dataclasses

    from pydantic import BaseModel

    @dataclasses.dataclass(frozen=True)
    class Call:
        tool: str
        api_key: str
        args: dict[str, Any]

    class Msg(BaseModel):
        role: str
        content: str
        calls: list[Call] = []

    s = secrets()
    call = Call("gh", "plain-looking", {"header": f"Bearer {s['bearer']}"})
    msg = Msg(role="tool", content=f"got {s['github']}", calls=[call])
    out = Redactor()([msg, call, Msg(role="user", content="nothing here")])
    assert out[0] is not msg and type(out[0]) is Msg
    assert out[0].content == "got [REDACTED:github]"
    assert out[0].calls[0].api_key == "[REDACTED:field]"
    assert out[0].calls[0].args["header"] == "Bearer [REDACTED:bearer]"
    assert out[1].api_key == "[REDACTED:field]" and out[1].tool == "gh"
    assert msg.content.startswith("got ghp_") and call.api_key == "plain-looking"  # not mutated
    clean = Msg(role="user", content="nothing here")
    assert Redactor()(clean) is clean  # unchanged objects are not copied


def test_sets_slots_dataclasses_and_pydantic_extra_fields_are_walked(tmp_path: Path) -> None:
    # The walker skipped sets and frozensets, dataclasses with slots=True (no __dict__) and
    # the fields a pydantic model keeps in __pydantic_extra__: serde stored all of them whole.
    import copy
    import dataclasses

    from pydantic import BaseModel, ConfigDict

    @dataclasses.dataclass(slots=True, frozen=True)
    class Slotted:
        text: str
        api_key: str

    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        role: str

    stashpoint.register_type(Slotted, "tests.redact.Slotted")
    stashpoint.register_type(Loose, "tests.redact.Loose")
    s = secrets()
    state = {
        "set": {f"saw {s['openai']}", "plain"},
        "frozen": frozenset({(f"tuple {s['github']}",)}),
        "slots": Slotted(f"pasted {s['slack']}", "plain-looking"),
        "extra": Loose(role="tool", content=f"got {s['google']}", nested={"password": "pw1"}),
    }
    before = copy.deepcopy(state)
    out = Redactor()(state)
    assert state == before, "the caller's objects are not mutated"
    assert type(out["set"]) is set and out["set"] == {"saw [REDACTED:openai]", "plain"}
    assert type(out["frozen"]) is frozenset
    assert out["frozen"] == frozenset({("tuple [REDACTED:github]",)})
    assert out["slots"] == Slotted("pasted [REDACTED:slack]", "[REDACTED:field]")
    assert type(out["extra"]) is Loose and out["extra"].role == "tool"
    assert out["extra"].model_extra == {
        "content": "got [REDACTED:google]",
        "nested": {"password": "[REDACTED:field]"},
    }
    assert state["extra"].model_extra["content"].startswith("got AIza")  # not mutated
    clean = {"s": {"a"}, "f": frozenset({"b"}), "l": Loose(role="u", x="y")}
    assert Redactor()(clean)["s"] is clean["s"] and Redactor()(clean) == clean

    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main")
        cp = run.checkpoint(state)
        assert run.state(cp.id) == out
    raw = _store_bytes(tmp_path / "st")
    for name in ("openai", "github", "slack", "google"):
        assert s[name].encode() not in raw, name
    assert b"plain-looking" not in raw and b"pw1" not in raw


def test_secret_key_names_in_every_spelling_and_non_string_values(tmp_path: Path) -> None:
    # Hyphens, no separator (PGPASSWORD), camelCase were missed, and only string values
    # under a secret key were replaced: a list or dict under "password" was stored.
    import dataclasses

    from pydantic import BaseModel

    secret_named = {
        "X-Api-Key": "hunter2-xapikey",
        "api-key": "hunter2-apidash",
        "PGPASSWORD": "hunter2-pg",
        "clientSecret": "hunter2-client",
        "githubToken": "hunter2-camel",
        "openaiApiKey": "hunter2-camelkey",
        "Set-Cookie": "session=hunter2-cookie",
        "credentials": {"user": "u", "pw": "hunter2-credsdict"},
        "password": ["hunter2-pwlist"],
        "secrets": {"OPENAI": "hunter2-secrets"},
        "db_password": 123456,
    }
    harmless: dict[str, Any] = {
        "max_tokens": 512,
        "token_count": 3,
        "tokens": ["a", "b"],
        "passwords_checked": 2,
        "keyboard": "qwerty",
        "monkey": "george",
        "primary_key": "id",
        "nextPageToken": "page-2-cursor",
        "NextToken": "aws-cursor",
        "eos_token": "</s>",
        "max_token": 256,
        "token": {"id": 15043, "text": "Hello"},  # an LLM's text token, not a credential
        "password": None,
        "has_password": True,
        "api_key": "",
    }
    r = Redactor()
    out = r({"env": secret_named, "cfg": harmless})
    assert out["env"] == dict.fromkeys(secret_named, "[REDACTED:field]")
    assert out["cfg"] is harmless
    assert r(out) == out  # idempotent

    # In a model's attribute the shape is kept: the model must validate when restored.
    class Conn(BaseModel):
        host: str
        credentials: dict[str, str]
        passwords: list[str] = []
        api_keys: list[str] = []

    @dataclasses.dataclass
    class Job:
        name: str
        secret: list[str]

    stashpoint.register_type(Conn, "tests.redact.Conn")
    stashpoint.register_type(Job, "tests.redact.Job")
    conn = Conn(host="db", credentials={"user": "hunter2-u", "pw": "hunter2-modeldict"})
    job = Job("nightly", ["hunter2-dclist"])
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main")
        cp = run.checkpoint({"env": secret_named, "cfg": harmless, "conn": conn, "job": job})
        got = run.state(cp.id)
    assert got["env"] == out["env"] and got["cfg"] == harmless
    mark = "[REDACTED:field]"
    assert got["conn"] == Conn(host="db", credentials={"user": mark, "pw": mark})
    assert got["job"] == Job("nightly", [mark])
    assert conn.credentials["pw"] == "hunter2-modeldict" and job.secret == ["hunter2-dclist"]
    assert b"hunter2" not in _store_bytes(tmp_path / "st")


def test_free_text_env_dumps_headers_urls_and_provider_tokens() -> None:
    # These reached the store in plaintext: only dict keys were matched by name, and the
    # hand-kept value patterns knew none of these providers.
    basic = "ZGVwbG95OnM0ZmUtcGFzc3dvcmQtOTk="
    tokens = {
        "stripe": "sk_live_" + _rand(24),
        "huggingface": "hf_" + _rand(34, string.ascii_letters),
        "gitlab_token": "glpat-" + _rand(20),
        "npm": "npm_" + _rand(36),
    }
    r = Redactor()
    header = r(f"> GET / HTTP/1.1\n> Authorization: Basic {basic}\n> Accept: */*")
    assert basic not in header and "> Accept: */*" in header
    env = r("HOME=/home/agent\nPGPASSWORD=pg-s3cret-99\nPATH=/usr/bin")
    assert env == "HOME=/home/agent\nPGPASSWORD=[REDACTED:field]\nPATH=/usr/bin"
    url = r("connecting to postgres://app:Pa55-word@db.internal:5432/app")
    assert url == "connecting to postgres://app:[REDACTED:url_password]@db.internal:5432/app"
    for name, value in tokens.items():
        assert r(f"log: sent {value} ok") == f"log: sent [REDACTED:{name}] ok", name
    code = 'token = os.environ["GITHUB_TOKEN"]; f(api_key=api_key, max_tokens=1024)'
    assert r(code) is code


def test_more_secret_key_names_and_secrets_used_as_dict_keys() -> None:
    gh = "ghp_" + _rand(36)
    state = {
        "pwd": "pw-s3cret",
        "auth": "user:pw",
        "ssh_key": "AAAAC3NzaC1lZDI1NTE5AAAAI" + _rand(43),
        "sessionid": "q8w7e6r5t4",
        "DB_PASS": "hunter2x",
        "seen": {gh: "a repo token as a key", "ok": 1},
    }
    harmless = {"max_tokens": 1, "nextPageToken": "p2", "token_count": 2, "session_id": "t-1"}
    r = Redactor()
    out = r({**state, **harmless})
    assert all(out[k] == "[REDACTED:field]" for k in ("pwd", "auth", "ssh_key", "sessionid"))
    assert out["DB_PASS"] == "[REDACTED:field]"
    assert out["seen"] == {"[REDACTED:github]": "a repo token as a key", "ok": 1}
    assert {k: out[k] for k in harmless} == harmless
    custom = Redactor(extra_keys=["pin"])({"card_pin": "1234", "spin": "fast"})
    assert custom == {"card_pin": "[REDACTED:field]", "spin": "fast"}


def test_labels_are_redacted_and_detect_secrets_loads_only_when_used(tmp_path: Path) -> None:
    hf = "hf_" + _rand(34, string.ascii_letters)
    (tmp_path / "pyproject.toml").write_text('[tool.stashpoint]\nredact_keys = ["pin"]\n')
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("main", workspace=tmp_path)
        cp = run.checkpoint({"x": 1, "card_pin": "4321"}, label=f"before using {hf}", files=False)
        run.label(cp.id, f"pinned {hf}")
        assert run.state(cp.id)["card_pin"] == "[REDACTED:field]"
        assert list(run.labels().values()) == ["pinned [REDACTED:huggingface]"]
    assert hf.encode() not in _store_bytes(tmp_path / "st")
    # detect-secrets costs ~0.2 s to import: its rules ship in the package, so it is
    # imported only when one of its own rules matches (this token is caught by a context
    # rule), and nothing is written outside the store (no cache file).
    probe = (
        "import sys, stashpoint\n"
        "run = stashpoint.open('memory://').session('s')\n"
        "print('detect_secrets' in sys.modules)\n"
        f"cp = run.checkpoint({{'note': 'used {hf} for the download'}})\n"
        "print('detect_secrets' in sys.modules, run.state(cp.id)['note'])\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    assert out[:2] == ["False", "False"]
    assert " ".join(out[2:]) == "used [REDACTED:huggingface] for the download"
    assert not (tmp_path / "cache").exists()
