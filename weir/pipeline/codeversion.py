"""A processor's code version (`src-…`): a hash of the code it runs, not of one function's text.

Starting from the processor's function, what is hashed:
- each function of the user's code it reaches: its source text (dedented; its bytecode, without line numbers,
  when no source is at hand: a function made by `exec` or typed at a prompt), the values of its closure and of
  its default arguments, and what its code reads (its own and that of the functions, lambdas, comprehensions
  and classes inside it): the global names it loads, and of a user module it loads or imports in its body, the
  attributes its code names (`helpers.score(x)`: helpers.score);
- each class of the user's code it reaches: its source, its bases and its members (methods as functions);
- the values read: None, booleans, numbers, strings, bytes, and tuples, lists, sets and dicts of them (sets and
  dicts sorted), enums, dataclass instances (their fields), dates, times, durations, decimals, fractions, UUIDs,
  paths, regular expressions and Spark data types by their text; an instance of a user class by its class and
  attributes; a weir object made of user code by what makes it (a `@stateful` block: its function, timer
  handler, migration, key, output, state declarations, clock and time to live); any other object by its type;
- code that is not the user's (the standard library, installed packages, weir, PySpark) by its qualified name
  only: its code is versioned by its package's release, and is not read.

User code is code whose file lies outside the standard library, site-packages (and a virtual environment),
weir's and PySpark's packages; code without a file (`exec`, `python -c`, a notebook's cell) counts as the user's.

Not hashed: code the function does not reach (another processor of the same module, a comment outside the
functions reached), module names and file paths (one code loaded as `shop.py` or as `examples.shop.pipeline`
has one version), line numbers. Deterministic across processes: no ids, addresses or hash-ordered iteration
reach the text hashed; cycles (recursion) are followed once, and the walk is bounded.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import decimal
import dis
import enum
import fractions
import functools
import hashlib
import importlib.machinery
import importlib.util
import inspect
import os
import pathlib
import re
import site
import sys
import sysconfig
import textwrap
import types
import uuid
from collections import deque
from typing import Any

MAX_UNITS = 5_000  # functions and classes read; beyond, how many more is hashed, not their code
MAX_DEPTH = 24  # nesting of values (containers, attributes) read; deeper, the type is hashed

# The method of a weir object made of user code (weir.blocks.keyed.Stateful): the values that make it up
PROTOCOL = "__weir_code__"

_GLOBAL_OPS = frozenset(
    {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME",
     "DELETE_NAME"}
)  # fmt: skip
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "STORE_ATTR", "DELETE_ATTR", "IMPORT_FROM"})
_BY_REPR = (
    datetime.date, datetime.time, datetime.timedelta, datetime.tzinfo, decimal.Decimal, fractions.Fraction,
    uuid.UUID, pathlib.PurePath,
)  # fmt: skip
_SCALARS = (bool, int, float, complex, str, bytes)  # bool first: an int too
_DESCRIPTORS = (
    types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
    types.MethodWrapperType, types.GetSetDescriptorType, types.MemberDescriptorType,
)  # fmt: skip
# A class's members that its source already says, or that Python keeps for itself
_CLASS_OWN = frozenset(
    {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__",
     "__annotations__", "__orig_bases__", "__parameters__", "_abc_impl"}
)  # fmt: skip


def code_version(fn: Any) -> str:
    """`src-` and 12 hex digits of the SHA-256 of `code_text(fn)`."""
    return "src-" + hashlib.sha256(code_text(fn).encode()).hexdigest()[:12]


def code_text(fn: Any) -> str:
    """The text a code version hashes (readable: one line per name read, each function's and class's source)."""
    return _Walk().text(fn)


# -- whose code is it ------------------------------------------------------------------------------------------


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The directories whose code is not the user's: the standard library and site-packages (of the interpreter
    and of its base), a virtual environment's whole prefix, user site-packages, weir's, PySpark's and Py4J's
    packages. Not the base interpreter's whole prefix: /usr holds /usr/src/app too."""
    dirs: set[str] = set()
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}  # fmt: skip
    for scheme_vars in (None, base):
        paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
    if sys.prefix != sys.base_prefix:
        dirs.update({sys.prefix, sys.exec_prefix})
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except (AttributeError, TypeError):  # an embedded interpreter's reduced site module
        pass
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # weir's package
    for name in ("pyspark", "py4j"):
        try:
            spec = importlib.util.find_spec(name)  # locates, runs nothing
        except (ImportError, ValueError):
            spec = None
        for where in (spec.submodule_search_locations or []) if spec else []:
            dirs.add(where)
    return tuple(sorted({os.path.realpath(d) for d in dirs if d}))


@functools.lru_cache(maxsize=4096)
def _user_path(path: str) -> bool:
    real = os.path.realpath(path)
    if {"site-packages", "dist-packages"} & set(pathlib.PurePath(real).parts):
        return False
    return not any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in _library_dirs())


def _user_module(module: types.ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    if isinstance(file, str) and file:
        return _user_path(file)
    spec = getattr(module, "__spec__", None)
    if module.__name__ in sys.builtin_module_names or getattr(spec, "origin", None) in ("built-in", "frozen"):
        return False
    paths = list(getattr(module, "__path__", None) or [])  # a namespace package
    if paths:
        return all(_user_path(p) for p in paths)
    return True  # made in memory: `python -c`'s __main__, a notebook's


def _user_named(module_name: Any) -> bool:
    """Whether the module named `module_name` (a function's or class's __module__) is the user's; one that is not
    loaded (exec with globals of one's own) is."""
    if module_name == "builtins":
        return False
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    return module is None or _user_module(module)


def _user_function(fn: types.FunctionType) -> bool:
    file = fn.__code__.co_filename
    if file and not file.startswith("<"):
        return _user_path(file)
    return _user_named(fn.__module__)  # "<string>", "<stdin>", "<frozen ...>": its module says


def _user_class(cls: type) -> bool:
    return _user_named(cls.__module__)


def _ref(obj: Any) -> str:
    """A name for code that is not the user's: module and qualified name (for the user's, the qualified name only:
    a module's name depends on how it was loaded)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return name if _user_named(module) else f"{module}.{name}"


# -- what code reads -------------------------------------------------------------------------------------------


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """`code` and the code objects inside it (functions, lambdas, comprehensions, classes), outermost first."""
    found, todo = [], [code]
    while todo:
        c = todo.pop(0)
        found.append(c)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return found


def _reads(code: types.CodeType) -> tuple[list[str], list[str], list[tuple[str, int]]]:
    """(global names, attribute names, imports as (name, level)) that `code` and the code inside it use. A name
    of co_names no instruction here classifies counts as both a global and an attribute."""
    names: set[str] = set()
    attrs: set[str] = set()
    imports: set[tuple[str, int]] = set()
    for c in _codes(code):
        classified: set[str] = set()
        before: list[dis.Instruction] = []
        for ins in dis.get_instructions(c):
            if ins.opname in _GLOBAL_OPS:
                names.add(ins.argval)
                classified.add(ins.argval)
            elif ins.opname in _ATTR_OPS:
                attrs.add(ins.argval)
                classified.add(ins.argval)
            elif ins.opname == "IMPORT_NAME":
                level = before[-2].argval if len(before) >= 2 and before[-2].opname == "LOAD_CONST" else 0
                imports.add((ins.argval, level if isinstance(level, int) else 0))
                classified.add(ins.argval)
            before = [*before[-1:], ins]
        rest = set(c.co_names) - classified
        names |= rest
        attrs |= rest
    return sorted(names), sorted(attrs), sorted(imports)


def _source(obj: Any) -> str | None:
    try:
        text = inspect.getsource(obj)
    except Exception:  # no file (exec, a prompt), a stale or missing one, a class inspect cannot find
        return None
    return textwrap.dedent(text.replace("\r\n", "\n"))


def _file_text(path: str | None) -> str:
    try:
        data = pathlib.Path(path or "").read_bytes().replace(b"\r\n", b"\n")
    except OSError:
        return "unreadable"
    return "file sha256 " + hashlib.sha256(data).hexdigest()


class _Walk:
    """One code version's walk: functions and classes are units, read once each (a queue, not recursion, so
    deep call graphs and cycles are fine), named in the text by their qualified name (#2, #3... for another of
    the same name, in the order found); values are read in place, to MAX_DEPTH."""

    def __init__(self) -> None:
        self.labels: dict[int, str] = {}  # id -> label, in-process only: ids never reach the text
        self.alive: list[Any] = []  # the objects labelled: their ids stay theirs while the walk lasts
        self.taken: set[str] = set()
        self.todo: deque[tuple[str, Any]] = deque()
        self.reading: set[int] = set()  # values being read: one met again inside itself is a cycle

    def text(self, root: Any) -> str:
        lines = ["root " + self.value(root, 0)]
        read = 0
        while self.todo:
            if read == MAX_UNITS:
                lines.append(f"and {len(self.todo)} more functions and classes, not read")
                break
            label, obj = self.todo.popleft()
            read += 1
            try:
                lines.append(
                    self.function(label, obj) if isinstance(obj, types.FunctionType) else self.klass(label, obj)
                )
            except Exception as exc:  # never fails a declaration: what could not be read is named
                lines.append(f"{label} unreadable: {type(exc).__name__}")
        return "\n".join(lines)

    def label(self, obj: Any, kind: str) -> str:
        if id(obj) in self.labels:
            return self.labels[id(obj)]
        base = f"{kind} {getattr(obj, '__qualname__', None) or getattr(obj, '__name__', '?')}"
        label, n = base, 1
        while label in self.taken:
            n += 1
            label = f"{base}#{n}"
        self.taken.add(label)
        self.labels[id(obj)] = label
        self.alive.append(obj)
        self.todo.append((label, obj))
        return label

    # -- units

    def function(self, label: str, fn: types.FunctionType) -> str:
        code = fn.__code__
        source = _source(code)
        lines = [label, source if source is not None else "bytecode " + self.code(code, 0)]
        names, attrs, imports = _reads(code)
        scope = fn.__globals__
        modules: list[tuple[str, types.ModuleType]] = []
        for name in names:
            if name in scope:
                found = scope[name]
                lines.append(f"  global {name} = {self.value(found, 0)}")
                if isinstance(found, types.ModuleType) and _user_module(found):
                    modules.append((name, found))
            else:
                lines.append(f"  global {name}: {'builtin' if hasattr(builtins, name) else 'unbound'}")
        for name, level in imports:
            said, found_modules = self.imported(name, level, fn)
            lines.append(f"  import {'.' * level}{name}: {said}")
            modules.extend(("." * level + name, m) for m in found_modules)
        lines.extend(self.attributes(modules, attrs))
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                held = self.value(cell.cell_contents, 0)
            except ValueError:  # an empty cell: a name of the enclosing function not assigned yet
                held = "empty"
            lines.append(f"  free {name} = {held}")
        if fn.__defaults__:
            lines.append(f"  defaults {self.value(fn.__defaults__, 0)}")
        if fn.__kwdefaults__:
            lines.append(f"  keyword defaults {self.value(fn.__kwdefaults__, 0)}")
        if "__wrapped__" in vars(fn):  # a decorator's wrapper (functools.wraps): the function it calls
            lines.append(f"  wraps {self.value(vars(fn)['__wrapped__'], 0)}")
        return "\n".join(lines)

    def attributes(self, modules: list[tuple[str, types.ModuleType]], attrs: list[str]) -> list[str]:
        """The attributes named in the code, of the user modules it reaches (a package's submodules too)."""
        lines, seen = [], set()
        todo = deque(modules)
        while todo:
            path, module = todo.popleft()
            if id(module) in seen:
                continue
            seen.add(id(module))
            space = vars(module)
            for attr in attrs:
                if attr not in space:
                    continue
                found = space[attr]
                lines.append(f"  {path}.{attr} = {self.value(found, 0)}")
                if isinstance(found, types.ModuleType) and _user_module(found):
                    todo.append((f"{path}.{attr}", found))
        return lines

    def imported(self, name: str, level: int, fn: types.FunctionType) -> tuple[str, list[types.ModuleType]]:
        """What an import in a function's body names: a user module already loaded (its attributes that the
        code names are read; `import a.b` binds a, so a's too), else its file's hash when it is the user's and
        not loaded yet (importing it here would run it), else its name."""
        absolute = name
        if level:
            package = fn.__globals__.get("__package__") or ""
            try:
                absolute = importlib.util.resolve_name("." * level + name, package)
            except (ImportError, ValueError):
                return "unresolved", []
        module = sys.modules.get(absolute)
        if module is None:
            return self.unloaded(absolute), []
        if not _user_module(module):
            return f"module {absolute}", []
        top = sys.modules.get(absolute.partition(".")[0]) if not level and "." in absolute else None
        return "user module", [module] + ([top] if top is not None and _user_module(top) else [])

    def unloaded(self, name: str) -> str:
        parent, _, last = name.rpartition(".")
        search = None
        if parent:
            loaded = sys.modules.get(parent)
            search = getattr(loaded, "__path__", None) if loaded is not None else None
            if search is None:
                return "not loaded"
        try:
            spec = importlib.machinery.PathFinder.find_spec(last if parent else name, search)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        if not origin or origin in ("built-in", "frozen") or not _user_path(origin):
            return "not loaded" if not origin else f"module {name}"
        return "not loaded, " + _file_text(origin)

    def klass(self, label: str, cls: type) -> str:
        source = _source(cls)
        lines = [label, source if source is not None else "no source", f"  bases {self.value(cls.__bases__, 0)}"]
        for name, member in sorted(vars(cls).items()):
            if name not in _CLASS_OWN:
                lines.append(f"  {name} = {self.value(member, 0)}")
        return "\n".join(lines)

    def code(self, code: types.CodeType, depth: int) -> str:
        """A code object's text without its source: its signature, names and instructions (no line numbers),
        its constants (code inside it likewise)."""
        if depth >= MAX_DEPTH:
            return f"code {code.co_name} deeper than {MAX_DEPTH}"
        parts = [
            code.co_name, str(code.co_argcount), str(code.co_posonlyargcount), str(code.co_kwonlyargcount),
            str(code.co_flags), repr(code.co_varnames), repr(code.co_freevars), repr(code.co_cellvars),
            repr(code.co_names),
            " ".join(f"{i.opname}:{'' if i.arg is None else i.arg}" for i in dis.get_instructions(code)),
        ]  # fmt: skip
        consts = [self.code(c, depth + 1) if isinstance(c, types.CodeType) else self.value(c, depth + 1)
                  for c in code.co_consts]  # fmt: skip
        return "(" + " | ".join([*parts, "consts " + ", ".join(consts)]) + ")"

    # -- values

    def value(self, obj: Any, depth: int) -> str:
        if obj is None or obj is Ellipsis or obj is NotImplemented:
            return repr(obj)
        if isinstance(obj, enum.Enum):
            return f"{self.value(type(obj), depth + 1)}.{obj.name}"
        for kind in _SCALARS:
            if isinstance(obj, kind):
                text = kind.__repr__(obj)
                return text if type(obj) is kind else f"{self.value(type(obj), depth + 1)}({text})"
        if isinstance(obj, types.FunctionType):
            return self.label(obj, "def") if _user_function(obj) else self.foreign(obj, depth)
        if isinstance(obj, type):
            return self.label(obj, "class") if _user_class(obj) else f"class {_ref(obj)}"
        if isinstance(obj, types.ModuleType):
            return "user module" if _user_module(obj) else f"module {obj.__name__}"
        if isinstance(obj, types.BuiltinFunctionType):
            owner = obj.__self__
            if owner is None or isinstance(owner, types.ModuleType):
                module = getattr(obj, "__module__", None) or getattr(owner, "__name__", "")
                return f"builtin {module}.{obj.__qualname__}"
            return f"builtin {obj.__qualname__} of {self.value(owner, depth + 1)}"
        if isinstance(obj, _DESCRIPTORS):
            owner = getattr(obj, "__objclass__", None) or type(getattr(obj, "__self__", None))
            return f"descriptor {_ref(owner)}.{getattr(obj, '__name__', '?')}"
        if isinstance(obj, _BY_REPR):
            return f"{_ref(type(obj))} {obj!r}"
        if isinstance(obj, re.Pattern):
            return f"re {obj.pattern!r} flags {int(obj.flags)}"
        if isinstance(obj, types.CodeType):
            return "code " + self.code(obj, depth + 1)
        if depth >= MAX_DEPTH:
            return f"{_ref(type(obj))} deeper than {MAX_DEPTH}"
        if id(obj) in self.reading:
            return f"{_ref(type(obj))} (a cycle)"
        self.reading.add(id(obj))
        try:
            return self.composite(obj, depth + 1)
        except Exception as exc:  # a property that raises, a repr that fails: the type, and what went wrong
            return f"a {_ref(type(obj))} unreadable: {type(exc).__name__}"
        finally:
            self.reading.discard(id(obj))

    def foreign(self, fn: types.FunctionType, depth: int) -> str:
        """Code not the user's, by its module and qualified name (a decorator's wrapper from a library, which
        carries the user function's names, by its own code's name); what it wraps is read."""
        named = _ref(fn) if not _user_named(fn.__module__) else "wrapper " + fn.__code__.co_qualname
        wrapped = vars(fn).get("__wrapped__")
        return f"ref {named}" + ("" if wrapped is None else f" wrapping {self.value(wrapped, depth + 1)}")

    def composite(self, obj: Any, depth: int) -> str:
        kind = type(obj)
        if isinstance(obj, (tuple, list)):
            items = ", ".join(self.value(x, depth) for x in obj)
            named = "" if kind in (tuple, list) else self.value(kind, depth)  # a namedtuple's class
            return f"{named}[{items}]" if isinstance(obj, list) else f"{named}({items})"
        # Sets, and dicts (one built from a set is in its order), are read in an order of their own, not their
        # hash order (a function's hash is its id): the functions in them are found, and named, in that order
        if isinstance(obj, (set, frozenset)):
            return "{" + ", ".join(sorted(self.value(x, depth) for x in sorted(obj, key=_order))) + "}"
        if isinstance(obj, dict):
            pairs = sorted(obj.items(), key=lambda kv: _order(kv[0]))
            items = sorted(f"{self.value(k, depth)}: {self.value(v, depth)}" for k, v in pairs)
            named = "" if kind is dict else self.value(kind, depth)
            return named + "{" + ", ".join(items) + "}"
        if isinstance(obj, (staticmethod, classmethod)):
            return f"{kind.__name__} {self.value(obj.__func__, depth)}"
        if isinstance(obj, property):
            return "property " + self.value((obj.fget, obj.fset, obj.fdel), depth)
        if isinstance(obj, functools.partial):
            return "partial " + self.value((obj.func, obj.args, obj.keywords), depth)
        if isinstance(obj, types.MethodType):
            return f"method {self.value(obj.__func__, depth)} of {self.value(obj.__self__, depth)}"
        made_of = getattr(kind, PROTOCOL, None)
        if made_of is not None:
            try:
                parts = made_of(obj)
            except Exception as exc:
                return f"{_ref(kind)} (its code unknown: {type(exc).__name__})"
            return f"{self.value(kind, depth)} made of {self.value(parts, depth)}"
        if dataclasses.is_dataclass(obj):
            fields = ", ".join(f"{f.name}={self.value(getattr(obj, f.name, None), depth)}"
                               for f in dataclasses.fields(obj))  # fmt: skip
            return f"{self.value(kind, depth)}({fields})"
        if str(getattr(kind, "__module__", "")).startswith("pyspark.sql.types") and callable(
            getattr(obj, "json", None)
        ):
            return f"{_ref(kind)} {obj.json()}"
        if _user_class(kind):
            return f"{self.value(kind, depth)} with {self.value(_attributes(obj), depth)}"
        return f"a {_ref(kind)}"


def _order(obj: Any) -> tuple[str, str, str, bytes, str, int]:
    """A key that orders a set's members the same in every process (their type, name, code): ties are alike."""
    kind = type(obj)
    if obj is None or isinstance(obj, _SCALARS):
        return str(kind.__module__), kind.__qualname__, repr(obj), b"", "", 0
    named = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        consts = repr([c for c in code.co_consts if c is None or isinstance(c, _SCALARS)])
        return str(kind.__module__), kind.__qualname__, named, code.co_code, consts, code.co_firstlineno
    return str(kind.__module__), kind.__qualname__, named, b"", "", 0


def _attributes(obj: Any) -> dict[str, Any]:
    """An instance's attributes: its __dict__ and its slots."""
    found = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                found[slot] = getattr(obj, slot)
    return found
