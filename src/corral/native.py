"""The compiled core: the scheduling core, the policies and the simulator's hot modules, compiled
to C by mypyc.

The same sources, type-checked by mypy, compiled by mypyc (mypy's compiler, which also builds mypy
and black). About 2x faster on a replay; the decisions are the same. `python -m
corral.build_native` (run by scripts/setup.sh) compiles `modules()` into
`<package>/.native/<digest>/`, where the digest is a hash of their sources and of the
interpreter's ABI. Importing `corral` installs a
finder that loads a compiled module only from the build whose digest matches the sources as they
are now, so an edited source is never shadowed by a stale build: until it is rebuilt, everything
runs interpreted, as it does where no compiler was available. CORRAL_PURE_PYTHON=1 turns the
compiled modules off.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent
PURE_ENV = "CORRAL_PURE_PYTHON"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so
_POLICIES = ("fair_share", "noargs", "ordering", "quota", "tiresias", "tiresias_memo", "victims")
_SIM = ("engine", "timeline", "given", "eventlog", "metrics", "jobmodel", "ideal", "options", "simjob")


def modules(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The compiled modules: every module of the core (not its package `__init__`), the built-in
    policies' plugins, and the simulator's event loop, event log, measures, options, trace jobs and
    job model."""
    core = sorted(p.stem for p in (package_dir / "core").glob("*.py") if p.stem != "__init__")
    return (
        [f"corral.core.{m}" for m in core]
        + [f"corral.policies.{m}" for m in _POLICIES]
        + [f"corral.sim.{m}" for m in _SIM]
    )


def _source(package_dir: Path, module: str) -> Path:
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def digest(package_dir: Path = PACKAGE_DIR) -> str:
    """A hash of the compiled modules' names and sources and of the interpreter's ABI."""
    h = hashlib.sha256(f"{sys.implementation.cache_tag} {_SUFFIX}\n".encode())
    for module in modules(package_dir):
        h.update(f"{module}\n".encode())
        h.update(_source(package_dir, module).read_bytes())
    return h.hexdigest()[:20]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and mypyc's shared library for them) in one build folder."""

    def __init__(self, root: Path, names: frozenset[str]) -> None:
        self.root = root
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names and not (fullname.endswith("__mypyc") and "." not in fullname):
            return None
        file = self.root / (fullname.replace(".", "/") + _SUFFIX)
        if not file.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def current_build(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The build for the sources as they are now, if there is one and CORRAL_PURE_PYTHON is unset."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    builds = package_dir / ".native"
    if not builds.is_dir():  # never built here: skip hashing the sources
        return None
    try:
        root = builds / digest(package_dir)
    except OSError:
        return None
    return root if (root / "BUILT").is_file() else None


def install() -> Path | None:
    """Load the compiled modules from now on, if a build for the current sources exists; return
    its folder (None: running interpreted)."""
    root = current_build()
    if root is not None and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(root, frozenset(modules())))
    return root


def active() -> bool:
    """Whether the scheduling core in use here is the compiled one."""
    import corral.core.cycle

    return str(corral.core.cycle.__file__).endswith(_SUFFIX)


def build(package_dir: Path = PACKAGE_DIR, quiet: bool = True) -> Path:
    """Compile `modules()` for the current sources (nothing to do if already built); the folder."""
    from mypyc.build import mypycify  # the dev tools: mypy ships mypyc
    from setuptools import setup  # type: ignore[import-untyped]

    out = package_dir / ".native"
    root = out / digest(package_dir)
    if (root / "BUILT").is_file():
        return root
    out.mkdir(exist_ok=True)
    src = package_dir.parent
    work = Path(tempfile.mkdtemp(prefix="build-", dir=out))
    cwd = Path.cwd()
    try:
        os.chdir(src)  # mypyc names modules after their paths from here: corral/core/x.py
        paths = [str(_source(package_dir, m).relative_to(src)) for m in modules(package_dir)]
        extensions = mypycify(paths, target_dir=str(work / "c"), verbose=not quiet)
        args = ["build_ext", "--build-lib", str(work / "lib"), "--build-temp", str(work / "tmp")]
        setup(
            name="corral-native",
            ext_modules=extensions,
            script_args=(["--quiet", *args] if quiet else args),
        )
        (work / "lib" / "BUILT").write_text(digest(package_dir) + "\n")
        try:
            (work / "lib").rename(root)
        except OSError:  # another build got there first: theirs is the same
            if not (root / "BUILT").is_file():
                raise
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    for old in out.iterdir():  # builds for older sources
        if old != root and old.is_dir() and not old.name.startswith("build-"):
            shutil.rmtree(old, ignore_errors=True)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["build"]
    if args[:1] == ["build"]:
        root = build(quiet="-v" not in args)
        print(f"compiled {len(modules())} modules into {root}")
        return 0
    if args[:1] == ["status"]:
        print("compiled" if active() else "interpreted")
        return 0
    print("usage: python -m corral.build_native [build [-v] | status]", file=sys.stderr)
    return 2
