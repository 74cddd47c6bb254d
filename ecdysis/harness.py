"""The harness: a small folder of text files (harness.toml, prompt templates, harness.py) stored
content-addressed with a parent link, so every change is a diff and every version runs alone."""

from __future__ import annotations

import ast
import hashlib
import re
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ecdysis.errors import InputError
from ecdysis.store import HarnessVersion, Store

STARTER_DIR = Path(__file__).resolve().parent / "starter_harness"
# The starter for function-calling suites (bfcl-*): the tools in the prompt, the calls as the answer.
STARTER_AGENT_DIR = Path(__file__).resolve().parent / "starter_agent"
MAX_FILE_BYTES = 256 * 1024
MAX_FILES = 64
TEXT_SUFFIXES = {".toml", ".md", ".py", ".txt", ".json", ".jsonl", ".yaml", ".yml"}


def harness_id(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()[:12]


def check_name(name: str) -> str:
    """A harness file name is a relative POSIX path inside the folder, with a text suffix."""
    path = Path(name)
    if path.is_absolute() or ".." in path.parts or name.startswith(("/", "\\")) or "\\" in name:
        raise InputError(f"file name {name!r} leaves the harness folder")
    if path.suffix not in TEXT_SUFFIXES:
        raise InputError(f"file {name!r} is not a harness text file ({', '.join(sorted(TEXT_SUFFIXES))})")
    return path.as_posix()


def validate_files(files: dict[str, str], *, origin: str = "harness") -> None:
    """harness.toml parses, its entry file exists and compiles. Raises InputError naming the file."""
    if len(files) > MAX_FILES:
        raise InputError(f"{len(files)} files; a harness has at most {MAX_FILES}", path=origin)
    for name, text in files.items():
        check_name(name)
        if len(text.encode()) > MAX_FILE_BYTES:
            raise InputError(f"larger than {MAX_FILE_BYTES} bytes", path=f"{origin}/{name}")
    if "harness.toml" not in files:
        raise InputError("harness.toml is missing", path=origin)
    try:
        config = tomllib.loads(files["harness.toml"])
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(exc), path=f"{origin}/harness.toml") from exc
    except RecursionError as exc:  # tomllib recurses into nested arrays and tables
        raise InputError("nested too deeply", path=f"{origin}/harness.toml") from exc
    toml_path = f"{origin}/harness.toml"
    section = config.get("harness", {})
    if not isinstance(section, dict):
        raise InputError(f"`harness` must be a table ([harness]), not {_toml_type(section)}", path=toml_path,
                         hint='[harness] with name, description and entry = "harness.py:solve"')
    entry = section.get("entry", "harness.py:solve")
    if not isinstance(entry, str) or not ENTRY.fullmatch(entry):
        raise InputError(f"entry {entry!r} is not FILE.py:FUNCTION", path=toml_path, hint='e.g. "harness.py:solve"')
    entry_file, _, entry_function = entry.partition(":")
    if entry_file not in files:
        raise InputError(f"entry file {entry_file!r} is missing", path=toml_path)
    check_params(config.get("params", {}), path=toml_path)
    trees: dict[str, ast.Module] = {}
    for name, text in files.items():
        if name.endswith(".py"):
            try:
                trees[name] = ast.parse(text, name)
                compile(trees[name], name, "exec")
            except SyntaxError as exc:
                raise InputError(f"syntax error: {exc.msg}", path=f"{origin}/{name}", line=exc.lineno) from exc
            except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes; nesting the compiler gives up on
                raise InputError(f"does not compile ({type(exc).__name__}: {exc})", path=f"{origin}/{name}") from exc
    if entry_function not in _top_level_names(trees[entry_file]):
        raise InputError(f"{entry_file} defines no function {entry_function!r} (the entry point)",
                         path=toml_path, hint=f"define `def {entry_function}(task, model, harness)` at the top level "
                                              f"of {entry_file}, or change `entry`")


# The runtime parameters the starter harness reads, with the types it needs; other [params] keys
# are the harness's own business and may hold any TOML value.
PARAM_TYPES: dict[str, tuple[str, Callable[[object], bool]]] = {
    "temperature": ("a number from 0 to 2", lambda v: _number(v) and 0 <= v <= 2),  # type: ignore[operator]
    "max_tokens": ("a whole number from 1 to 32768", lambda v: _whole(v) and 1 <= v <= 32768),  # type: ignore[operator]
    "samples": ("a whole number from 1 to 64", lambda v: _whole(v) and 1 <= v <= 64),  # type: ignore[operator]
    "retries": ("a whole number from 0 to 16", lambda v: _whole(v) and 0 <= v <= 16),  # type: ignore[operator]
    "stop": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
}
ENTRY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.py:[A-Za-z_][A-Za-z0-9_]*")


def check_params(params: object, *, path: str) -> None:
    """`[params]` is a table whose known keys have the types the harness runtime expects."""
    if not isinstance(params, dict):
        raise InputError(f"`params` must be a table ([params]), not {_toml_type(params)}", path=path)
    for key, (wanted, ok) in PARAM_TYPES.items():
        if key in params and not ok(params[key]):
            raise InputError(f"params.{key} = {params[key]!r} must be {wanted}", path=path)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _toml_type(v: object) -> str:
    return {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "an array"}.get(
        type(v), type(v).__name__)


def _top_level_names(tree: ast.Module) -> set[str]:
    """Functions defined, names assigned or imported at a module's top level."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def read_dir(folder: Path) -> dict[str, str]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("not a harness folder", path=str(folder))
    files: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise InputError("links are not allowed in a harness", path=str(path))
        if not path.is_file() or "__pycache__" in path.parts or path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            files[check_name(path.relative_to(folder).as_posix())] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InputError("not UTF-8 text", path=str(path)) from exc
    validate_files(files, origin=str(folder))
    return files


def write_dir(files: dict[str, str], folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = folder / check_name(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return folder


def starter_files() -> dict[str, str]:
    return read_dir(STARTER_DIR)


def new_version(files: dict[str, str], *, parent: str | None, note: str = "",
                status: str = "candidate") -> HarnessVersion:
    validate_files(files)
    return HarnessVersion(id=harness_id(files), files=dict(files), parent=parent, note=note,
                          created_at=time.time(), status=status)


def ensure_starter(store: Store) -> HarnessVersion:
    version = new_version(starter_files(), parent=None, note="starter harness", status="starter")
    existing = store.get_harness(version.id)
    return existing or store.put_harness(version)


def ensure_starter_agent(store: Store) -> HarnessVersion:
    version = new_version(read_dir(STARTER_AGENT_DIR), parent=None, note="starter agent harness", status="starter")
    return store.get_harness(version.id) or store.put_harness(version)


def calls_functions(suite: Any) -> bool:
    """Whether a suite's answers are function calls (scored `bfcl_ast`, or `bfcl_multi_turn` for a
    conversation of them): its default starter is then the agent harness, since the plain starter
    never shows the model the functions."""
    return getattr(getattr(suite, "scorer", None), "kind", None) in ("bfcl_ast", "bfcl_multi_turn")


def params(files: dict[str, str]) -> dict[str, object]:
    return dict(tomllib.loads(files.get("harness.toml", "")).get("params", {}))
