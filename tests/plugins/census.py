"""Pytest plugin: which tests start a real process (a server, a worker, a browser, a command).

``pytest --collect-only -q --process-census`` prints, after collection, how many of the collected tests
start a real process and in how many modules; ``--process-census=FILE`` also writes one ``nodeid`` per
such test to FILE. ``tests/plugins/tiers.py`` marks the same tests ``integration``.

The rule is static, so that two checkouts are counted the same way without running either: a test
starts a process when its function, or a fixture in its closure, reaches a process start. A function
reaches one when its code (nested functions and lambdas included) names a process start of the standard
library (``subprocess.Popen``/``run``/``call``/``check_call``/``check_output``, ``os.system``,
``os.fork``, ``os.exec*``, ``os.spawn*``, ``os.posix_spawn*``, ``multiprocessing.Process``,
``asyncio.create_subprocess_*``) or of Playwright (``sync_playwright``), or names a function or class
of this project (the test tree and the apps) that reaches one. Names are resolved in the function's own
module, then as imported modules (for imports inside a function); a class reaches one when one of its
methods does. It over-counts (a branch never taken still
counts), which does not change between two counts of the same tree.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROCESS_STARTS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
           "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
           "spawnl", "spawnle", "spawnlp", "spawnlpe"},
    "multiprocessing": {"Process", "Pool"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "playwright.sync_api": {"sync_playwright"},
}
_STARTERS = {getattr(sys.modules.get(module) or __import__(module, fromlist=["_"]), name, None)
             for module, names in PROCESS_STARTS.items() for name in names} - {None}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--process-census", nargs="?", const="-", default=None, metavar="FILE",
                     help="after collection, count the tests that start a real process (see tests/plugins/census.py); "
                          "with FILE, also write their node ids there")


def _is_ours(obj: object) -> bool:
    """Whether ``obj`` was defined in a source file of this checkout outside its virtualenv."""
    try:
        source = Path(inspect.getsourcefile(obj) or "")
    except (TypeError, OSError):
        return False
    return source.is_relative_to(REPO) and ".venv" not in source.parts


def _module(name: str) -> types.ModuleType | None:
    """The module ``name`` when it is imported already, or is this project's (then it is imported now)."""
    if name in sys.modules:
        return sys.modules[name]
    top = name.partition(".")[0]
    if not top.isidentifier() or not ((REPO / top).is_dir() or (REPO / f"{top}.py").is_file()):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


class Census:
    """Decides, per function, whether it reaches a process start (see the module's docstring); results are
    cached per code object and class, and a cycle counts as not reaching one."""

    def __init__(self) -> None:
        self._functions: dict[types.CodeType, bool] = {}
        self._classes: dict[type, bool] = {}

    def reaches(self, func) -> bool:
        """True when ``func`` (a function, method or class) reaches a process start."""
        func = inspect.unwrap(getattr(func, "__func__", func))
        if isinstance(func, type):
            return self._class_reaches(func)
        code = getattr(func, "__code__", None)
        if code is None:
            return func in _STARTERS
        if code not in self._functions:
            self._functions[code] = False  # a recursion or a cycle ends here
            self._functions[code] = self._code_reaches(code, getattr(func, "__globals__", {}))
        return self._functions[code]

    def _class_reaches(self, cls: type) -> bool:
        if cls not in self._classes:
            self._classes[cls] = False
            self._classes[cls] = _is_ours(cls) and any(
                self.reaches(member) for member in vars(cls).values()
                if inspect.isfunction(getattr(member, "__func__", member)) or isinstance(member, property))
        return self._classes[cls]

    def _code_reaches(self, code: types.CodeType, namespace: dict) -> bool:
        names = {name for each in _code_objects(code) for name in each.co_names}
        for name in names:
            target = namespace.get(name)
            if target is None:  # a module imported inside the function puts its name here too
                target = _module(name)
            if target is None:
                continue
            if isinstance(target, types.ModuleType):
                members = PROCESS_STARTS.get(target.__name__, ())
                if names & set(members):
                    return True
                if _is_ours(target) and any(
                        self.reaches(getattr(target, attr)) for attr in names
                        if callable(getattr(target, attr, None)) and _is_ours(getattr(target, attr))):
                    return True
            elif isinstance(target, property):
                continue
            elif target in _STARTERS if _hashable(target) else False:
                return True
            elif callable(target) and _is_ours(target) and self.reaches(target):
                return True
        return False


def _hashable(obj: object) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


CENSUS = Census()


def starts_process(item: pytest.Item) -> bool:
    """Whether the test ``item`` starts a real process: its function or a fixture of its closure reaches a
    process start (see the module's docstring)."""
    functions = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in info.names_closure:
            functions.extend(definition.func for definition in info.name2fixturedefs.get(name, ()))
    return any(CENSUS.reaches(func) for func in functions if func is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    target = session.config.getoption("--process-census")
    if target is None:
        return
    starting = [item for item in session.items if starts_process(item)]
    modules = Counter(item.nodeid.split("::")[0] for item in starting)
    line = (f"process census: {len(starting)} of {len(session.items)} tests start a real process, "
            f"in {len(modules)} modules")
    session.config.get_terminal_writer().line(line)
    if target != "-":
        Path(target).write_text("".join(f"{item.nodeid}\n" for item in starting))
