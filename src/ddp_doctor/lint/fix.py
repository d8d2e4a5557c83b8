"""``ddp-doctor lint --fix``: the safe, local fixes.

* DDP103 — drop the ``shuffle=True`` keyword of a DataLoader that has a sampler;
* DDP301 — add ``map_location="cpu"`` to ``torch.load`` (always safe: ``load_state_dict``
  copies into the model's own device);
* DDP403 — add ``persistent_workers=True`` (``persistent_workers=<num_workers> > 0`` when
  ``num_workers`` is not a literal, since ``persistent_workers=True`` with 0 workers raises).

Edits are computed from ``ast`` positions and ``tokenize`` (for the commas), and touch only
the flagged call: the rest of the file — formatting, comments — is left byte for byte.
A file whose fixed text would not parse is left unchanged.
"""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path
from typing import Sequence

from ddp_doctor.lint.names import NOTCONST, arg_or_kw, const_value


class _Text:
    """Maps ast (line, utf-8 byte column) positions to offsets in the text."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.lines = text.splitlines(keepends=True)

    def offset(self, line: int, col_bytes: int) -> int:
        src = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(src.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))

    def tok_offset(self, pos: tuple[int, int]) -> int:  # tokenize columns are characters
        return self.starts[pos[0] - 1] + pos[1]


def _tokens(text: str, t: _Text, start: int, end: int) -> list[tuple[int, int, tokenize.TokenInfo]]:
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            s, e = t.tok_offset(tok.start), t.tok_offset(tok.end)
            if s >= end:
                break
            if e > start:
                out.append((s, e, tok))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _call_args_end(call: ast.Call) -> tuple[int, int] | None:
    nodes = [*call.args, *call.keywords]
    if not nodes:
        return None
    last = max(nodes, key=lambda n: (n.end_lineno, n.end_col_offset))
    return last.end_lineno, last.end_col_offset


def _edit_drop_keyword(text: str, t: _Text, call: ast.Call, kw: ast.keyword) -> tuple[int, int, str] | None:
    ks, ke = t.offset(kw.lineno, kw.col_offset), t.offset(kw.end_lineno, kw.end_col_offset)
    cs, ce = t.offset(call.lineno, call.col_offset), t.offset(call.end_lineno, call.end_col_offset)
    toks = _tokens(text, t, cs, ce)
    after = [x for x in toks if x[0] >= ke]
    before = [x for x in toks if x[1] <= ks]
    sig_after = [x for x in after if x[2].type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    if sig_after and sig_after[0][2].string == ",":
        comma_end = sig_after[0][1]
        nxt = sig_after[1] if len(sig_after) > 1 else None
        if nxt is not None and nxt[2].string != ")" and nxt[2].start[0] == sig_after[0][2].end[0]:
            return ks, nxt[0], ""  # `shuffle=True, sampler=s` -> `sampler=s`
        if nxt is not None and nxt[2].string == ")" and nxt[2].start[0] == sig_after[0][2].end[0]:
            # last keyword with a trailing comma on one line: also eat the comma before it
            prev = [x for x in before if x[2].type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
            if prev and prev[-1][2].string == ",":
                return prev[-1][0], comma_end, ""
            return ks, comma_end, ""
        # `shuffle=True,\n    sampler=s`: remove the keyword, its comma and the rest of the line's blanks
        end = comma_end
        while end < len(text) and text[end] in " \t":
            end += 1
        start = ks
        line_start = text.rfind("\n", 0, ks) + 1
        if text[line_start:ks].strip() == "" and end < len(text) and text[end] == "\n":
            start, end = line_start, end + 1  # the keyword had its own line: drop the line
        return start, end, ""
    prev = [x for x in before if x[2].type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    if prev and prev[-1][2].string == ",":
        return prev[-1][0], ke, ""  # last argument: `(ds, shuffle=True)` -> `(ds)`
    return ks, ke, ""


def _edit_add_keyword(text: str, t: _Text, call: ast.Call, src: str) -> tuple[int, int, str] | None:
    end = _call_args_end(call)
    if end is None:
        return None
    pos = t.offset(*end)
    return pos, pos, f", {src}"


def _find_call(tree: ast.AST, line: int, col: int, text: str = "") -> ast.Call | None:
    lines = text.splitlines()
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    col_bytes = len(src[: col - 1].encode("utf-8"))  # finding columns are characters, ast's are bytes
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == line and node.col_offset == col_bytes:
            return node
    return None


def _edits(text: str, tree: ast.AST, fixes) -> list[tuple[int, int, str, str]]:
    t = _Text(text)
    edits = []
    for finding, kind, _node in fixes:
        loc = finding.location
        call = _find_call(tree, loc.line, loc.column, text)
        if call is None:
            continue
        edit = None
        if kind == "drop-shuffle":
            kw = next((k for k in call.keywords if k.arg == "shuffle"), None)
            if kw is not None:
                edit = _edit_drop_keyword(text, t, call, kw)
        elif kind == "map-location":
            edit = _edit_add_keyword(text, t, call, 'map_location="cpu"')
        elif kind == "persistent-workers":
            nw = arg_or_kw(call, 5, "num_workers")
            if nw is not None:
                val = const_value(nw)
                if val is not NOTCONST and isinstance(val, int) and val > 0:
                    edit = _edit_add_keyword(text, t, call, "persistent_workers=True")
                else:
                    seg = ast.get_source_segment(text, nw) or ast.unparse(nw)
                    if "\n" in seg:
                        seg = ast.unparse(nw)
                    if not isinstance(nw, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)):
                        seg = f"({seg})"
                    edit = _edit_add_keyword(text, t, call, f"persistent_workers={seg} > 0")
        if edit is not None:
            edits.append((*edit, finding.code))
    return edits


def fix_source(text: str, path: str = "<string>", *, select: Sequence[str] | None = None,
               ignore: Sequence[str] | None = None, max_rounds: int = 8) -> tuple[str, list[tuple[str, int]]]:
    """Apply every safe fix to ``text``; returns (new text, [(code, line)] of what was fixed)."""
    from ddp_doctor.lint.engine import lint_source

    done: list[tuple[str, int]] = []
    for _ in range(max_rounds):
        res = lint_source(text, path, select=select, ignore=ignore)
        if res.error is not None or not res.fixes:
            break
        tree = ast.parse(text)
        edits = sorted(_edits(text, tree, res.fixes), key=lambda e: (e[0], e[1]), reverse=True)
        applied, new, last_start = [], text, None
        for s, e, repl, code in edits:
            if last_start is not None and e > last_start:
                continue  # overlaps an edit already taken: next round
            new = new[:s] + repl + new[e:]
            last_start = s
            applied.append((code, text.count("\n", 0, s) + 1))
        if not applied:
            break
        try:
            ast.parse(new)
        except SyntaxError:
            break  # never write a file that no longer parses
        text = new
        done += applied
    return text, sorted(done, key=lambda x: x[1])


def apply_fixes(fixes_by_path: dict[str, list], *, select=None, ignore=None) -> tuple[int, list[str]]:
    """Fix the files in place; returns (number of fixes, human-readable notes)."""
    from ddp_doctor.lint.engine import read_source
    from ddp_doctor.atomic import write_atomic

    total, notes = 0, []
    for path in fixes_by_path:
        text, err = read_source(Path(path))
        if err is not None:
            continue
        new, done = fix_source(text, path, select=select, ignore=ignore)
        if done and new != text:
            write_atomic(path, new)  # (UTF-8 bytes as they are: the file's own line endings kept)
            total += len(done)
            for code, line in done:
                notes.append(f"{path}:{line}: fixed {code}")
    return total, notes
