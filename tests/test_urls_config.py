"""Store URLs parsed once, backends chosen by a scheme registry, settings resolved in one place."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import stashpoint
from stashpoint import config
from stashpoint.durability import Durability
from stashpoint.errors import UsageError
from stashpoint.stores import registry
from stashpoint.urls import StoreURL, parse_store_url

from .conftest import Result

Sp = Callable[..., Result]

# -- urls ------------------------------------------------------------------------------------


def test_url_options_are_taken_out_once_and_the_rest_goes_to_the_backend() -> None:
    u = parse_store_url("postgresql://h/db?sslmode=require&blobs=s3%3A//b/p&durability=exit")
    assert (u.scheme, u.blobs, u.durability) == ("postgresql", "s3://b/p", "exit")
    assert u.target == "postgresql://h/db?sslmode=require"
    assert u.server and u.path is None and u.home is None
    plain = parse_store_url(None)
    assert (plain.scheme, plain.explicit, plain.path) == ("sqlite", False, Path(".stashpoint"))
    assert not parse_store_url("memory://").server
    assert parse_store_url("x?blobs=s3://b/p", blobs="s3://b/p").blobs == "s3://b/p"
    with pytest.raises(UsageError, match="two values for blobs"):
        parse_store_url("x?blobs=s3://b/p", blobs="s3://b/q")


def test_url_home_and_absolute_form(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    assert parse_store_url(f"sqlite://{db}").home == tmp_path / "agent.db.d"
    assert parse_store_url(str(tmp_path / "s" / "store.db")).home == tmp_path / "s"
    assert parse_store_url(f"file://{tmp_path}").home == tmp_path
    assert parse_store_url(f"sqlite://{tmp_path}/store.db").absolute() == str(tmp_path)
    # The query is kept as written (an s3:// inside it is not a path to normalise).
    rel = parse_store_url("sqlite://rel?blobs=s3://b/x").absolute()
    assert rel == f"sqlite://{os.path.abspath('rel')}?blobs=s3://b/x"
    assert parse_store_url("redis://h/0").absolute() == "redis://h/0"


def test_hook_logs_beside_a_broken_store_named_by_its_db(sp: Sp, tmp_path: Path) -> None:
    """The CLI finds a store's directory from its URL as the library does: ``store.db`` is
    the database of the directory it is in (the hook once looked for ``store.db.d``)."""
    db = tmp_path / "proj" / ".stashpoint" / "store.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 100)
    proj = db.parent.parent
    payload = json.dumps({"session_id": "x", "hook_event_name": "Stop", "cwd": str(proj)})
    res = sp("--store", str(db), "hooks", "run", "claude-code", cwd=proj, input=payload)
    assert res.code == 0 and res.out == ""
    assert "FAILED" in (db.parent / "hooks.log").read_text()


# -- the backend registry --------------------------------------------------------------------


@pytest.fixture
def scratch_scheme() -> Iterator[str]:
    """A third-party scheme: a memory store per open, registered for this test only."""
    from stashpoint.stores.memory import MemoryStore

    seen: list[StoreURL] = []

    def opener(url: StoreURL) -> registry.Opened:
        seen.append(url)
        return registry.Opened(MemoryStore())

    registry.register_backend("scratch", opener, blobs="scratch keeps its blobs itself")
    try:
        yield "scratch"
    finally:
        registry.unregister_backend("scratch")
    assert seen and all(u.scheme == "scratch" and "durability" not in u.target for u in seen)


def test_a_registered_scheme_opens_a_working_store(scratch_scheme: str) -> None:
    with stashpoint.open(f"{scratch_scheme}://anything?durability=exit") as store:
        assert store.durability == Durability("exit")  # stashpoint's own option, taken out
        run = store.session("s")
        cp = run.checkpoint({"n": 1})
        assert store.session("s").state(cp.id) == {"n": 1}
    with pytest.raises(UsageError, match="scratch keeps its blobs itself"):
        stashpoint.open(f"{scratch_scheme}://x", blobs="s3://bucket/p")
    with pytest.raises(UsageError, match="already registered"):
        registry.register_backend(scratch_scheme, "x:y")


def test_an_installed_package_declares_a_scheme_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found through the package metadata (a real dist-info on sys.path), imported on use."""
    (tmp_path / "sp_plugin_demo.py").write_text(
        "from stashpoint.stores.memory import MemoryStore\n"
        "from stashpoint.stores.registry import Opened\n"
        "def opener(url):\n"
        "    return Opened(MemoryStore())\n"
    )
    info = tmp_path / "sp_plugin_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sp-plugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[stashpoint.backends]\nplugdemo = sp_plugin_demo:opener\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "plugdemo" in registry.known_schemes()
        assert "sp_plugin_demo" not in sys.modules  # listed without importing it
        with pytest.raises(UsageError, match=r"unsupported store URL scheme 'bogus'.*plugdemo://"):
            stashpoint.open("bogus://x")
        with stashpoint.open("plugdemo://x") as store:
            store.session("s").checkpoint({"ok": True})
    finally:
        registry.unregister_backend("plugdemo")
        sys.modules.pop("sp_plugin_demo", None)


def test_unknown_scheme_names_every_builtin_backend() -> None:
    with pytest.raises(UsageError) as err:
        stashpoint.open("bogus://x")
    for name in ("sqlite://", "file://", "memory://", "postgresql://", "redis://"):
        assert name in str(err.value)


def test_a_local_store_refuses_an_unknown_url_option(tmp_path: Path) -> None:
    """Once it made a directory named ``s?prefix=x``."""
    with pytest.raises(UsageError, match="no option 'prefix=x'"):
        stashpoint.open(f"sqlite://{tmp_path}/s?prefix=x")
    assert list(tmp_path.iterdir()) == []


# -- settings: argument > environment > pyproject > store meta > default ----------------------


def test_durability_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STASHPOINT_DURABILITY", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    path = tmp_path / "s"
    with stashpoint.open(path) as store:
        assert store.durability == Durability("fsync")  # the default
        store.set_durability("group:16")
    with stashpoint.open(path) as store:
        assert str(store.durability) == "group:16"  # the store's record
    (project / "pyproject.toml").write_text('[tool.stashpoint]\ndurability = "group:8"\n')
    with stashpoint.open(path) as store:
        assert str(store.durability) == "group:8"  # pyproject beats the store
    monkeypatch.setenv("STASHPOINT_DURABILITY", "exit")
    with stashpoint.open(path) as store:
        assert str(store.durability) == "exit"  # the environment beats pyproject
    with stashpoint.open(path, durability="group:4") as store:
        assert str(store.durability) == "group:4"  # the argument beats the environment
    with stashpoint.open(f"sqlite://{path}?durability=fsync") as store:
        assert str(store.durability) == "fsync"  # so does the URL's option
    got = config.resolve(config.DURABILITY, stored="group:16")
    assert (got.value, got.source) == ("exit", "$STASHPOINT_DURABILITY")


def test_pyproject_setting_of_the_wrong_type_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STASHPOINT_DURABILITY", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.stashpoint]\ndurability = 5\n")
    with pytest.raises(UsageError, match=r"\[tool.stashpoint\] durability must be a str"):
        stashpoint.open(tmp_path / "s")


def test_environment_order_within_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first variable set wins; an empty one counts as unset."""
    monkeypatch.setenv("STASHPOINT_S3_ENDPOINT", "")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws.example")
    assert config.resolve(config.S3_ENDPOINT).source == "$AWS_ENDPOINT_URL"
    monkeypatch.setenv("STASHPOINT_S3_ENDPOINT", "http://minio.example")
    assert config.value(config.S3_ENDPOINT) == "http://minio.example"
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert config.resolve(config.S3_REGION) == config.Resolved("us-east-1", "default")
