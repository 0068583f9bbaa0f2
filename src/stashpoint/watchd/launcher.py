"""The site-less launcher: a ``stashpoint`` script whose interpreter starts without ``site``.

A served command's floor is the interpreter's start, and in an environment with many packages
a third of that is :mod:`site` (the ``.pth`` files of the environment, ``sitecustomize``, the
listing of ``site-packages``): about 3 ms of CPU of a served ``snap`` here. None of it is
needed to hand a command to the watch daemon, since the thin client uses the standard library
only. So the launcher starts ``python -S``, puts the directory holding the ``stashpoint``
package at the end of ``sys.path`` (where ``site-packages`` would be) and asks the daemon
(:func:`stashpoint.__main__.launch`). A command the daemon does not serve first runs
:func:`site.main` in the same process, which does what the start-up would have done (the
environment's paths, ``.pth`` files, ``sitecustomize``), and then the CLI runs as from the
console script pip writes. The one trace left is ``sys.flags.no_site``.

pip cannot write such a script (its console-script wrappers take no interpreter options), so
``make setup`` writes it over pip's wrapper::

    python -I -m stashpoint.watchd.launcher .venv/bin/stashpoint

Only a wrapper of ``stashpoint.__main__:main`` (or an earlier launcher) is replaced; a later
``pip install`` writes its own wrapper again, which works as before, only slower to start.
"""

from __future__ import annotations

import os
import sys

__all__ = ["is_replaceable", "script", "script_for", "write"]

_MARK = "# stashpoint site-less launcher"
_ENTRY = "from stashpoint.__main__ import main"
_SHEBANG_MAX = 127  # what a kernel reads of a #! line (Linux: 127 bytes before 5.1)


def script(executable: str, package_dir: str) -> str:
    """The launcher's text for interpreter ``executable`` and the directory ``package_dir``
    that holds the ``stashpoint`` package. An interpreter path a ``#!`` line cannot carry
    (spaces, too long) is started through ``/bin/sh``, as pip's own wrappers do."""
    if " " not in executable and len(executable) + len("#! -S") <= _SHEBANG_MAX:
        head = f"#!{executable} -S\n"
    else:
        quoted = "".join("\\" + c if c in '\\"$`' else c for c in executable)
        head = f"#!/bin/sh\n'''exec' \"{quoted}\" -S \"$0\" \"$@\"\n' '''\n"
    return (
        f"{head}{_MARK}: see stashpoint.watchd.launcher (written by `make setup`)\n"
        "import sys\n"
        f"sys.path.append({package_dir!r})\n"
        "try:\n"
        "    from stashpoint.__main__ import launch\n"
        "except ImportError:  # moved or uninstalled: start as pip's wrapper would\n"
        "    sys.path.pop()\n"
        "    for name in [m for m in sys.modules if m.split('.')[0] == 'stashpoint']:\n"
        "        del sys.modules[name]\n"
        "    import site\n"
        "\n"
        "    site.main()\n"
        "    from stashpoint.__main__ import main\n"
        "\n"
        "    def launch(_where):\n"
        "        return main()\n"
        "\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
        f"    sys.exit(launch({package_dir!r}))\n"
    )


def is_replaceable(path: str) -> bool:
    """``path`` is pip's wrapper of ``stashpoint.__main__:main`` or an earlier launcher."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return _MARK in text or (_ENTRY in text and text.startswith("#!"))


def script_for(executable: str) -> str | None:
    """The ``stashpoint`` script beside interpreter ``executable`` that runs stashpoint with
    it (pip's wrapper or the launcher), or None. A hook is faster through it than through
    ``python -m stashpoint`` (no ``runpy``; with the launcher, no ``site`` either)."""
    path = os.path.join(os.path.dirname(executable), "stashpoint")
    if not is_replaceable(path) or not os.access(path, os.X_OK):
        return None
    with open(path, encoding="utf-8") as f:
        head = "".join(f.readline() for _ in range(3))
    return (
        path
        if f"#!{executable}\n" in head
        or f"#!{executable} -S\n" in head
        or (head.startswith("#!/bin/sh\n") and f'"{executable}"' in head)
        else None
    )


def write(path: str, executable: str, package_dir: str) -> None:
    """Write the launcher to ``path`` (atomically: a command starting meanwhile runs either
    the old script or the new one)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(script(executable, package_dir))
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -I -m stashpoint.watchd.launcher PATH/TO/bin/stashpoint")
        return 2
    target = args[0]
    if not is_replaceable(target):
        print(f"{target}: not pip's stashpoint script; left as it is", file=sys.stderr)
        return 1
    here = os.path.abspath(__file__)  # <package_dir>/stashpoint/watchd/launcher.py
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    write(target, sys.executable, package_dir)
    print(f"{target}: site-less launcher for {sys.executable} ({package_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
