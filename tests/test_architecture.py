"""The package's shape stays what docs/architecture.md says: every module in a layer, no
module importing from a layer above its own (import-linter, which also sees imports inside
functions), and no module growing past 800 lines.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_docs import generated_file_is_current

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the CI runs 3.11

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "stashpoint"
MAX_LINES = 800
# Modules still over the limit, at most as long as they are now: each may only shrink
# (a split moves code into new modules, which the limit then covers).
OVERSIZED: dict[str, int] = {}


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["type"] == "layers"]
    return [re.split(r"\s*[:|]\s*", layer.strip()) for layer in contract["layers"]]


def test_every_module_has_a_layer() -> None:
    named = {m for layer in _layers() for m in layer}
    found = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    assert sorted(found - named) == [], "add these modules to a layer in pyproject.toml"
    assert sorted(named - found) == [], "these layer entries name no module"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_modules_stay_small() -> None:
    too_long = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > OVERSIZED.get(rel, MAX_LINES):
            too_long[rel] = lines
    assert too_long == {}, f"split these modules (limit {MAX_LINES} lines): {too_long}"


MAX_SESSION_LINES = 500
MAX_PROTOCOL_METHODS = 12


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def test_session_stays_under_500_lines() -> None:
    """``Session`` is the engine's core; what is not about one checkpoint's making lives in the
    modules it is assembled from (reading, binding, restoring, editing, durable runs...)."""
    cls = _classes(PACKAGE / "session.py")["Session"]
    assert cls.end_lineno is not None
    lines = cls.end_lineno - cls.lineno + 1
    assert lines < MAX_SESSION_LINES, f"Session is {lines} lines: move a concern out of it"


def test_backend_protocols_stay_narrow() -> None:
    """Each backend capability (``stores.base``'s ``Protocol`` classes) is small enough to
    implement and to wrap: at most 12 methods, defaults included."""
    protocols = {
        name: sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in cls.body)
        for name, cls in _classes(PACKAGE / "stores" / "base.py").items()
        if any(ast.unparse(base) in ("Protocol", "typing.Protocol") for base in cls.bases)
    }
    assert len(protocols) >= 5, f"found too few backend protocols: {sorted(protocols)}"
    wide = {name: n for name, n in protocols.items() if n > MAX_PROTOCOL_METHODS}
    assert wide == {}, f"split these protocols (at most {MAX_PROTOCOL_METHODS} methods): {wide}"


def test_the_ref_layer_reaches_only_the_protocols(tmp_path: Path) -> None:
    """Heads are verified in one place, the ref layer. A backend's own methods and
    attributes (its connection, a raw head write) are not reachable through it: code that
    needs them names the backend, never the layer that signs and checks."""
    import stashpoint
    from stashpoint.stores.refauth import AuthenticatedRefs

    with stashpoint.open(tmp_path / "store") as store:
        refs = store.refs
        assert isinstance(refs, AuthenticatedRefs)
        assert store.meta is refs
        for name in ("_db", "_tx", "path"):
            assert hasattr(store.backend, name), name  # the backend does have them
            with pytest.raises(AttributeError):
                getattr(refs, name)


_META_CALLS = {"get_meta", "set_meta", "iter_meta"}
# The conformance suite exercises a backend's key-value space with arbitrary keys of its own.
_META_EXEMPT = {"metakeys.py", "testing/conformance.py"}


def _literal_start(node: ast.AST) -> str | None:
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        node = node.left
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_meta_keys_are_named_only_in_metakeys() -> None:
    """No module spells a store meta key: a meta call starts its key with a name from
    metakeys, and no string is one of its prefixes ("run:", "checkout:"...)."""
    from stashpoint import metakeys

    prefixes = {
        value
        for name, value in vars(metakeys).items()
        if name.isupper() and isinstance(value, str) and value.endswith(":")
    }
    spelled = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in _META_EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in prefixes:
                spelled.add(f"{rel}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _META_CALLS
                and node.args
                and _literal_start(node.args[0]) is not None
            ):
                spelled.add(f"{rel}:{node.lineno}")
    assert sorted(spelled) == [], "name these keys in stashpoint/metakeys.py"


# The faces (the CLI, the web UI, the integrations, the async twins) work through the
# Store/Session facade; a store's backend (``store.meta``) is the storage and engine layers'.
_FACES = ("cli/", "webui/", "integrations/", "aio.py", "__main__.py", "_demo_agent.py")
# Modules of the faces still reaching into a backend, each with the reason it may.
_META_USERS: dict[str, str] = {}


def test_faces_do_not_use_a_stores_backend() -> None:
    """No face module reads ``<store>.meta``: neither a ``.meta`` of something named like a
    store (``store``, ``self.store``, aio's ``sync``) nor ``x.meta.<backend method>``."""
    from stashpoint.stores.base import MetadataStore

    backend_methods = {n for n in dir(MetadataStore) if not n.startswith("_")} - set(dir(dict))
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(_FACES) or rel in _META_USERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            inner = node.value
            if isinstance(inner, ast.Attribute) and inner.attr == "meta":
                if node.attr in backend_methods:  # x.meta.branches(...), x.meta.set_head(...)
                    found.add(f"{rel}:{node.lineno}")
            elif node.attr == "meta":
                owner = inner.attr if isinstance(inner, ast.Attribute) else ast.unparse(inner)
                if "store" in owner.lower() or owner == "sync":
                    found.add(f"{rel}:{node.lineno}")
    assert sorted(found) == [], "use the Store/Session facade's operations (stashpoint._store)"


def test_the_architecture_page_is_current() -> None:
    generated_file_is_current("architecture")
