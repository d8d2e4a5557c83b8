"""File discovery, reading, parsing and rule dispatch.  Bad input never raises: it becomes an error entry."""
from __future__ import annotations

import ast
import fnmatch
import gc
import io
import os
import re
import stat
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ddp_doctor.findings import Finding
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.project import Project
from ddp_doctor.lint.roots import project_root
from ddp_doctor.lint.rules import RULES, Context, Rule

#: Files larger than this are reported as an error entry instead of being parsed.
MAX_BYTES = 16 * 1024 * 1024
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
             ".ruff_cache", "node_modules", ".eggs", ".ipynb_checkpoints"}
# a file that mentions none of these cannot trigger any rule: parse it (syntax errors are still
# reported) but skip building the semantic model
_RELEVANT = re.compile(r"[dD]istributed|DataLoader|lightning|accelerat|fabric|deepspeed|horovod|torch\.load\b")
# a run holds many parsed trees (the project's model cache): the cyclic collector's full passes over
# them cost about 40% of the CPU time, yet nothing there is garbage (models are released without it,
# see Project.release_dropped).  So the collector is paused for the run, and the youngest generation
# (what the last files allocated, not the whole heap) is collected every this many files.
_GC_EVERY = 200
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)


@dataclass
class LintError:
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}

    # behave like the {"path", "message"} dict of the agreed API
    def __getitem__(self, key: str) -> str:
        return self.to_dict()[key]


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    error: LintError | None = None
    source: str | None = None
    fixes: list = field(default_factory=list)  # (finding, kind, node) for --fix


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[LintError] = field(default_factory=list)
    files: int = 0
    sources: dict[str, str] = field(default_factory=dict)  # path -> text (for the text format's source lines)
    fixes: dict[str, list] = field(default_factory=dict)  # path -> [(finding, kind, node)]

    def to_lint_dict(self) -> dict:
        from ddp_doctor.report import LINT_SCHEMA_ID
        return {"schema": LINT_SCHEMA_ID, "findings": [finding_dict(f) for f in self.findings],
                "errors": [e.to_dict() for e in self.errors]}


def finding_dict(f: Finding) -> dict:
    """The lint/v1 finding object, plus ``related`` (other files' lines that make it one) when there are."""
    d = f.to_lint_dict()
    if f.evidence.get("related"):
        d["related"] = list(f.evidence["related"])
    return d


def code_selected(code: str, select: Sequence[str] | None, ignore: Sequence[str] | None) -> bool:
    """Prefix selection as in ruff/flake8: ``DDP2`` selects DDP201, DDP202, ...; ``ALL`` selects everything."""
    def match(prefixes):
        return any(p == "ALL" or code.startswith(p.strip().upper()) for p in prefixes if p.strip())
    if select and not match(select):
        return False
    if ignore and match(ignore):
        return False
    return True


def selected_rules(select=None, ignore=None) -> list[type[Rule]]:
    return [r for r in RULES if code_selected(r.code, select, ignore)]


# ------------------------------------------------------------- discovery ---
def _is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() or (path / "conda-meta").is_dir()


def _excluded(path: Path, exclude: Sequence[str]) -> bool:
    s = path.as_posix()
    return any(fnmatch.fnmatch(s, pat) or fnmatch.fnmatch(path.name, pat) or
               fnmatch.fnmatch(s, f"*/{pat}") or fnmatch.fnmatch(s, f"*/{pat}/*") for pat in exclude)


def discover(paths: Iterable[str | os.PathLike[str]], exclude: Sequence[str] = ()) -> tuple[list[Path], list[LintError]]:
    """Python files under ``paths``.  Explicitly named files are always included."""
    files: list[Path] = []
    errors: list[LintError] = []
    seen: set[str] = set()

    def add(p: Path) -> None:
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            files.append(p)

    for raw in paths:
        p = Path(raw)
        if p.is_file() or (p.exists() and not p.is_dir()):
            add(p)
            continue
        if not p.is_dir():
            errors.append(LintError(str(p), "no such file or directory"))
            continue
        visited_dirs: set[str] = set()
        for root, dirs, names in os.walk(p, followlinks=True):
            real = os.path.realpath(root)
            if real in visited_dirs:  # a symlink loop (or a second link to the same tree)
                dirs[:] = []
                continue
            visited_dirs.add(real)
            rootp = Path(root)
            keep = []
            for d in sorted(dirs):
                dp = rootp / d
                if d in SKIP_DIRS or d.endswith(".egg-info") or (d.startswith(".") and d not in (".", "..")):
                    continue
                if _is_venv(dp) or (exclude and _excluded(dp, exclude)):
                    continue
                try:
                    if dp.is_symlink() and os.path.realpath(dp) in visited_dirs | {real}:
                        continue
                except OSError:
                    continue
                keep.append(d)
            dirs[:] = keep
            for n in sorted(names):
                if n.endswith((".py", ".pyi")) and not n.endswith(".pyi"):
                    fp = rootp / n
                    if exclude and _excluded(fp, exclude):
                        continue
                    if not fp.is_file() and not fp.exists():  # dangling symlink
                        continue
                    add(fp)
    return files, errors


# --------------------------------------------------------------- linting ---
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not read (reading a FIFO blocks, /dev/zero never ends), or None."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"not a regular file ({kind}); skipped"


def _too_large(size: int) -> str:
    return f"file too large to lint ({size / 2**20:.1f} MiB > {MAX_BYTES // 2**20} MiB limit); skipped"


def read_source(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, error message).  Only regular files are read, and at most
    :data:`MAX_BYTES`: the type and size are checked on the opened descriptor (no race with a file
    swapped after a first look), which is opened non-blocking so a FIFO cannot stall the open."""
    try:
        st = os.stat(path)
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    why = _not_regular(st.st_mode)
    if why is None and st.st_size > MAX_BYTES:
        why = _too_large(st.st_size)
    if why is not None:
        return None, why
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    try:
        st = os.fstat(fd)
        why = _not_regular(st.st_mode)
        if why is not None:
            return None, why
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:  # grew after the first look
        return None, _too_large(len(data))
    return decode_source(data)


def decode_source(data: bytes) -> tuple[str | None, str | None]:
    if b"\x00" in data:
        return None, "binary file (contains NUL bytes); not Python source"
    try:
        enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        return None, f"cannot decode: {e}"
    try:
        text = data.decode("utf-8-sig" if enc in ("utf-8-sig", "utf-8") else enc)
    except (UnicodeDecodeError, LookupError) as e:
        reason = e.reason if isinstance(e, UnicodeDecodeError) else str(e)
        pos = f" at byte {e.start}" if isinstance(e, UnicodeDecodeError) else ""
        return None, f"not valid {enc} text{pos} ({reason}); not Python source"
    return text, None


def lint_source(source: str, path: str = "<string>", *, select: Sequence[str] | None = None,
                ignore: Sequence[str] | None = None, noqa: bool = True, tree: ast.Module | None = None,
                project: Project | None = None) -> FileResult:
    """Lint one module's text (``tree``: its already parsed AST, if the caller has it).  ``project``: the
    files its imports may resolve to (default: the folder of ``path``, when it is a file on disk).
    Never raises for bad input: a problem becomes ``FileResult.error``."""
    res = FileResult(path, source=source)
    if project is None and path != "<string>" and os.path.isfile(path):
        project = Project([project_root(Path(path))])
    model = project.built(path, source) if project is not None else None
    if model is not None and tree is None:
        tree = model.tree  # parsed already, when another file imported this one
    try:
        if tree is None:
            tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        where = f" (line {e.lineno}" + (f", column {e.offset})" if e.offset else ")") if e.lineno else ""
        py = f"Python {sys.version_info.major}.{sys.version_info.minor}"
        res.error = LintError(path, f"syntax error: {e.msg}{where} [parsed with {py}]")
        return res
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        res.error = LintError(path, f"cannot parse: {type(e).__name__}: {e}")
        return res
    if not _RELEVANT.search(source) and not (project is not None and project.imports_relevant(path, tree, _RELEVANT)):
        return res
    rules = selected_rules(select, ignore)
    if not rules:
        return res
    try:
        if model is None:
            model = ModuleModel(tree, path, source)
        if project is not None:
            project.register(model)
    except RecursionError:
        res.error = LintError(path, "cannot analyse: nesting too deep")
        return res
    except Exception as e:  # noqa: BLE001 - never a traceback for one file
        res.error = LintError(path, f"internal error while analysing: {type(e).__name__}: {e}")
        return res
    lines = source.splitlines()
    ctx = Context(model, path, lines)
    distributed = None
    failures = []
    for rule_cls in rules:
        rule = rule_cls()
        try:
            if rule.needs_distributed:
                if distributed is None:
                    distributed = model.is_distributed
                if not distributed:
                    continue
            rule.check(ctx)
        except RecursionError:
            failures.append(f"{rule.code}: nesting too deep")
        except Exception as e:  # noqa: BLE001 - a rule bug must not hide the other files' findings
            failures.append(f"{rule.code}: {type(e).__name__}: {e}")
    if failures:
        res.error = LintError(path, "internal error in rule " + "; ".join(failures))
    seen = set()
    for f in ctx.findings:
        key = (f.code, f.location.line, f.location.column)
        if key in seen:
            continue
        seen.add(key)
        if noqa and _suppressed(lines, f):
            continue
        res.findings.append(f)
    kept = {id(f) for f in res.findings}
    res.fixes = [fx for fx in ctx.fixes if id(fx[0]) in kept]
    res.findings.sort(key=lambda f: (f.location.line, f.location.column or 0, f.code))
    return res


def _suppressed(lines: list[str], f: Finding) -> bool:
    line = f.location.line
    if not 0 < line <= len(lines):
        return False
    m = _NOQA.search(lines[line - 1])
    if not m:
        return False
    codes = m.group("codes")
    if not codes:
        return True
    return any(f.code.startswith(c.upper()) for c in re.split(r"[\s,]+", codes) if c)


def lint_file(path: str | os.PathLike[str], *, select=None, ignore=None, project: Project | None = None) -> FileResult:
    p = Path(path)
    text, err = read_source(p)
    if err is not None:
        return FileResult(str(p), error=LintError(str(p), err))
    return lint_source(text, str(p), select=select, ignore=ignore, project=project)


def project_roots(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Where imports may resolve: each directory linted, and the repository around each file linted."""
    roots = []
    for raw in paths:
        p = Path(raw)
        roots.append(p if p.is_dir() else project_root(p))
    return roots


def lint_paths(paths: Iterable[str | os.PathLike[str]], *, select: Sequence[str] | None = None,
               ignore: Sequence[str] | None = None, exclude: Sequence[str] = ()) -> LintResult:
    """Lint files and directories.  ``.findings`` are :class:`~ddp_doctor.findings.Finding` with locations."""
    return _lint_paths(list(paths), select, ignore, exclude)


def _lint_paths(paths: list, select, ignore, exclude) -> LintResult:
    files, errors = discover(paths, exclude)
    result = LintResult(errors=list(errors))
    project = Project(project_roots(paths))  # one per run: imports between the linted files resolve
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i, p in enumerate(files, 1):
            _lint_one(result, p, select, ignore, project)
            project.release_dropped()
            if i % _GC_EVERY == 0:
                gc.collect(0)
        project.release_dropped(everything=True)
    finally:
        if was_enabled:
            gc.enable()
    return result


def _lint_one(result: LintResult, p: Path, select, ignore, project: Project) -> None:
    """Lint one file into ``result``."""
    fr = lint_file(p, select=select, ignore=ignore, project=project)
    result.files += 1
    result.findings.extend(fr.findings)
    if fr.error is not None:
        result.errors.append(fr.error)
    if fr.source is not None and fr.findings:
        result.sources[fr.path] = fr.source
    if fr.fixes:
        result.fixes[fr.path] = fr.fixes
