"""A call's arguments as the call reads them: by position or keyword, and through a ``**kwargs`` dict read
whole (a dict literal or ``dict(...)`` here, updated here, or imported from another project file)."""
from __future__ import annotations

import ast

from ddp_doctor.lint.names import arg_or_kw, dotted
from ddp_doctor.lint.scopes import Scope


class CallArgs:
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel` (through ``ValueFlow``): a call's arguments."""

    def call_arg(self, call: ast.Call, pos: int | None, name: str, scope: Scope) -> ast.expr | None:
        """Argument ``name`` of ``call``, also from a ``**kwargs`` dict built here
        (``loader_args = dict(sampler=sampler, ...)`` ... ``DataLoader(dataset, **loader_args)``)."""
        got = arg_or_kw(call, pos, name) if pos is not None else next(
            (k.value for k in call.keywords if k.arg == name), None)
        if got is not None:
            return got
        for k in call.keywords:
            if k.arg is not None:
                continue
            for d in [k.value, *self.values_of(k.value, scope)]:
                if isinstance(d, ast.Dict):
                    got = next((v for kk, v in zip(d.keys, d.values)
                                if isinstance(kk, ast.Constant) and kk.value == name), None)
                elif isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "dict":
                    got = next((kw.value for kw in d.keywords if kw.arg == name), None)
                if got is not None:
                    return got
            got = self._dict_update(k.value, name, scope)
            if got is not None:
                return got
        return None

    def expand_star_kwargs(self, call: ast.Call, scope: Scope) -> ast.Call | None:
        """``call`` with its ``**kwargs`` dicts spelled out as keywords (``DataLoader(ds, sampler=s,
        **loader_kwargs)`` with ``loader_kwargs = dict(shuffle=True, ...)`` here, or a dict literal of another
        project file imported by name); ``call`` itself when it has none; None when one cannot be read whole
        (a parameter, a dict built key by key elsewhere, ``*args``)."""
        if not any(k.arg is None for k in call.keywords):
            return call
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        keywords = [k for k in call.keywords if k.arg is not None]
        for k in call.keywords:
            if k.arg is not None:
                continue
            got = self._whole_dict(k.value, scope)
            if got is None:
                return None
            keywords += [ast.keyword(arg=name, value=v) for name, v in got]
        out = ast.Call(func=call.func, args=call.args, keywords=keywords)
        return ast.copy_location(out, call)

    def _whole_dict(self, d: ast.expr, scope: Scope) -> list[tuple[str, ast.expr]] | None:
        """The (key, value) pairs of a dict every entry of which is known: a literal or ``dict(...)`` of
        constant keys, then ``d.update(k=v)`` / ``d["k"] = v`` in ``scope``."""
        vals = [d] if isinstance(d, (ast.Dict, ast.Call)) else self.values_of(d, scope)
        owner_scope = scope
        if not vals and isinstance(d, ast.Name) and d.id in self.import_from and self.project is not None:
            got = self.project.resolve_local(self, d.id)  # `from .settings import LOADER_KWARGS`
            level, module, attr = self.import_from[d.id]
            f = self.project.module_file(self, level, module) if got is None and attr else None
            owner = self.project.model_at(f, any_text=True) if f is not None else None
            if owner is None:
                return None
            vals, owner_scope = owner.scope.lookup(attr), owner.scope
            d = None  # updates in this scope are not to the other file's dict
        if len(vals) != 1:
            return None
        v = vals[0]
        if isinstance(v, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in v.keys):
            pairs = [(k.value, x) for k, x in zip(v.keys, v.values)]
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict" and not v.args and \
                all(kw.arg is not None for kw in v.keywords):
            pairs = [(kw.arg, kw.value) for kw in v.keywords]
        else:
            return None
        key = dotted(d) if d is not None else None
        if key is not None:
            for site in owner_scope.sites:
                f = site.call.func
                if isinstance(f, ast.Attribute) and f.attr == "update" and dotted(f.value) == key:
                    if site.call.args or any(kw.arg is None for kw in site.call.keywords):
                        return None
                    pairs += [(kw.arg, kw.value) for kw in site.call.keywords]
            for stmt, _c, _l in owner_scope.stmts:
                if isinstance(stmt, ast.Assign):
                    for t in stmt.targets:
                        if isinstance(t, ast.Subscript) and dotted(t.value) == key:
                            if not (isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str)):
                                return None
                            pairs.append((t.slice.value, stmt.value))
        last: dict[str, ast.expr] = {}
        for name, x in pairs:  # a later update wins, as at run time
            last[name] = x
        return list(last.items())

    def _dict_update(self, d: ast.expr, name: str, scope: Scope) -> ast.expr | None:
        """``d.update(name=v)`` or ``d["name"] = v`` in ``scope``: the ``v`` put into the dict later."""
        key = dotted(d)
        if key is None:
            return None
        for site in scope.sites:
            f = site.call.func
            if isinstance(f, ast.Attribute) and f.attr == "update" and dotted(f.value) == key:
                got = next((kw.value for kw in site.call.keywords if kw.arg == name), None)
                if got is not None:
                    return got
        for stmt, _c, _l in scope.stmts:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Subscript) and dotted(t.value) == key and \
                            isinstance(t.slice, ast.Constant) and t.slice.value == name:
                        return stmt.value
        return None
