"""Where a collective was called from, and through which torch API (``ddp_doctor.apis``).

The walk is the one ``frames.user_site_of`` makes (stop at the first user frame); on the way it looks each
frame's code object up in the API table, once per code object.  A collective the user called directly
stops at the first frame: the hot path costs what it did.  A site entered through an API is the 4-tuple
(path, line, function, API name); the publisher makes it ``Site(..., api=name)``.
"""
from __future__ import annotations

from ddp_doctor import apis
from ddp_doctor.frames import USER, kind, user_site_of

_MISSING = object()
_CODE_API: dict = {}  # code object -> API name | None
_CACHE_MAX = 8192


def _api_of(code) -> str | None:
    name = _CODE_API.get(code, _MISSING)
    if name is _MISSING:
        if len(_CODE_API) >= _CACHE_MAX:
            _CODE_API.clear()
        a = apis.lookup(code.co_filename, getattr(code, "co_qualname", code.co_name))
        name = _CODE_API[code] = a.name if a else None
    return name


def _called_as_module(frame) -> bool:
    """Was this ``forward`` run by ``nn.Module.__call__`` (torch's frames right above it)?"""
    f = frame.f_back
    for _ in range(3):
        if f is None or kind(f.f_code.co_filename) == USER:
            return False
        if getattr(f.f_code, "co_qualname", "").startswith("Module._"):
            return True
        f = f.f_back
    return False


def user_site_api(frame) -> tuple | None:
    """(path, line, function) of the innermost user frame, or (path, line, function, API) when the call
    went through an API of the table (the outermost one below the user's frame); failing a user frame, the
    innermost library frame, as ``frames.user_site_of``.  A collective issued inside an API (FSDP2's
    all-gather in a sharded layer's forward) from within the user's own ``Module.forward`` is the user's
    call of that module: the sharded model's forward is the same code in training and in an evaluation
    only rank 0 runs; the line that called the model tells them apart."""
    code = frame.f_code
    if kind(code.co_filename) == USER:  # the user called the collective: nothing to look up
        return (code.co_filename, frame.f_lineno, code.co_name)
    found: list[str] = []

    def internal(c) -> None:
        name = _api_of(c)
        if name is not None:
            found.append(name)

    def past(f) -> bool:
        return bool(found) and f.f_code.co_name == "forward" and _called_as_module(f)

    site = user_site_of(frame, internal, past)
    return site + (found[-1],) if site is not None and found else site
