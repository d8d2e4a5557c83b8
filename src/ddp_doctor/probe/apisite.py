"""Where a collective was called from, and through which torch API (``ddp_doctor.apis``).

The walk is the one ``frames.user_site_of`` makes (stop at the first user frame); on the way it looks each
frame's code object up in the API table, once per code object.  A collective the user called directly
stops at the first frame: the hot path costs what it did.  A site entered through an API is the 4-tuple
(path, line, function, API name); the publisher makes it ``Site(..., api=name)``.
"""
from __future__ import annotations

from ddp_doctor import apis
from ddp_doctor.frames import LIBRARY, USER, kind

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


def user_site_api(frame) -> tuple | None:
    """(path, line, function) of the innermost user frame, or (path, line, function, API) when the call
    went through an API of the table (the outermost one below the user's frame); failing a user frame, the
    innermost library frame, as ``frames.user_site_of``."""
    fallback = None
    api = None
    f = frame
    while f is not None:
        code = f.f_code
        k = kind(code.co_filename)
        if k == USER:
            return (code.co_filename, f.f_lineno, code.co_name, api) if api else \
                (code.co_filename, f.f_lineno, code.co_name)
        if k == LIBRARY:
            if fallback is None:
                fallback = (code.co_filename, f.f_lineno, code.co_name)
        else:
            name = _api_of(code)
            if name is not None:
                api = name
        f = f.f_back
    return fallback
