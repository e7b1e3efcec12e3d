"""What the sweep does to a valid input, and the property every outcome must have.

``mutate`` applies 0-3 edits drawn by hypothesis to a file's bytes, each one a mistake met in practice::

    truncate      cut at any byte (a download that stopped)
    flip          XOR 1-4 bytes (a bad disk, a bad copy)
    token         one field -> -1, nan, inf, 1e400, 2**63, 9999999999, 1.5, abc, '', a NUL ...
    line          a line deleted, duplicated or swapped with the next
    columns       a field added to or dropped from one line
    empty         nothing at all;   binary: random bytes
    compress      the result gzip-, xz- or bz2-compressed (then maybe truncated)

``check_clean`` runs one call and holds it to the CLI's promise: it returns, or raises one of the user errors
the CLI turns into one line and exit 2 (``haloflow.cli._USER_ERRORS``), its message one line naming the file or
flag -- never another exception type, never a slow call.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import time
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from haloflow.errors import HaloflowError

__all__ = ["SWEEP", "COUNTS", "USER_ERRORS", "mutate", "mutate_json", "check_clean", "BAD_TOKENS", "BAD_NUMBERS"]

# Every sweep test: reproducible in CI (derandomize), no example database written into the work tree, no
# per-example deadline (the first example of a reader pays numba's and pyarrow's warm-up) but a bound checked
# by check_clean.
SWEEP = dict(derandomize=True, database=None, deadline=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

COUNTS: Counter = Counter()  # "reader or command" -> inputs tried; printed by conftest.py at the end
OUTCOMES: Counter = Counter()  # ("reader or command", "ok" | "error") -> inputs

USER_ERRORS = (HaloflowError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
BAD_TOKENS = [b"-1", b"-0", b"nan", b"NaN", b"inf", b"-inf", b"1e400", b"9223372036854775808", b"9999999999",
              b"99999999999999999999999", b"1.5", b"abc", b"", b"\x00", b"0x1f", b"1,2", b"\xc3\xa9", b"#", b"%",
              b"p", b"c", b"a"]
BAD_NUMBERS = [-1, 0, 2**63, 10**12, 1e400, float("nan"), float("inf"), -0.5, 1.5, "abc", "", None, [], {}, True]
SLOW_S = 20.0  # one call on a small input; a hang (or a huge allocation's page faults) takes far longer


def _split_tokens(line: bytes) -> list[bytes]:
    for sep in (b"\t", b",", b" "):
        if sep in line:
            return line.split(sep)
    return [line]


def _join(line: bytes, tokens: list[bytes]) -> bytes:
    for sep in (b"\t", b",", b" "):
        if sep in line:
            return sep.join(tokens)
    return b" ".join(tokens)


def _edit(data: st.DataObject, raw: bytes) -> bytes:
    kind = data.draw(st.sampled_from(["truncate", "flip", "token", "token", "line", "columns", "empty", "binary"]))
    if kind == "empty":
        return b""
    if kind == "binary":
        return data.draw(st.binary(min_size=1, max_size=200))
    if not raw:
        return raw
    if kind == "truncate":
        return raw[: data.draw(st.integers(0, len(raw) - 1))]
    if kind == "flip":
        out = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(out) - 1))
            out[i] ^= data.draw(st.integers(1, 255))
        return bytes(out)
    lines = raw.split(b"\n")
    i = data.draw(st.integers(0, len(lines) - 1))
    if kind == "line":
        how = data.draw(st.sampled_from(["delete", "duplicate", "swap"]))
        if how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        return b"\n".join(lines)
    tokens = _split_tokens(lines[i])
    j = data.draw(st.integers(0, len(tokens) - 1))
    if kind == "token":
        tokens[j] = data.draw(st.sampled_from(BAD_TOKENS))
    elif data.draw(st.booleans()):
        tokens.insert(j, data.draw(st.sampled_from([b"1", b"0", b"x"])))
    elif len(tokens) > 1:
        del tokens[j]
    lines[i] = _join(lines[i], tokens)
    return b"\n".join(lines)


def mutate(data: st.DataObject, raw: bytes, *, compress: bool = True) -> bytes:
    """``raw`` with 0-3 drawn edits, then maybe compressed (and the compressed stream maybe cut)."""
    for _ in range(data.draw(st.integers(0, 3))):
        raw = _edit(data, raw)
    if compress and data.draw(st.integers(0, 4)) == 0:
        codec = data.draw(st.sampled_from([gzip.compress, lzma.compress, bz2.compress]))
        raw = codec(raw)
        if data.draw(st.booleans()):
            raw = raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
    return raw


def _paths(obj, prefix=()) -> list[tuple]:
    """Every path (tuple of keys and indices) into a JSON value, the value itself first."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):  # a few entries of a long list are enough
            out += _paths(v, prefix + (i,))
    return out


def mutate_json(data: st.DataObject, obj):
    """``obj`` (parsed JSON) with 1-3 drawn edits: a value replaced by a bad one (BAD_NUMBERS: negative, huge,
    NaN, inf, a string, null, a list, a bool) or by a neighbour changed by -1/+1/x2, or a key removed."""
    import copy
    import math

    obj = copy.deepcopy(obj)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            return data.draw(st.sampled_from(BAD_NUMBERS))
        path = data.draw(st.sampled_from(paths))
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        key, old = path[-1], parent[path[-1]]
        kind = data.draw(st.sampled_from(["bad", "bad", "nudge", "delete"]))
        if kind == "delete" and isinstance(parent, dict):
            del parent[key]
        elif kind == "nudge" and isinstance(old, (int, float)) and not isinstance(old, bool) and math.isfinite(old):
            parent[key] = data.draw(st.sampled_from([old - 1, old + 1, old * 2, -old]))
        else:
            parent[key] = data.draw(st.sampled_from(BAD_NUMBERS))
    return obj


def check_clean(what: str, call, *names: str):
    """Run ``call()``; count it under ``what``. Returns its result, or None after a clean user error.

    A clean error is one of ``USER_ERRORS``, one line, naming one of ``names`` (a file, a folder or a flag).
    Anything else -- another exception type, a message without a name, a call slower than SLOW_S -- fails.
    """
    COUNTS[what] += 1
    t0 = time.perf_counter()
    try:
        result = call()
    except USER_ERRORS as err:
        message = str(err)
        assert message.strip() and "\n" not in message.strip(), f"{what}: not one line: {message!r}"
        assert not names or any(str(n) in message for n in names), f"{what}: names none of {names}: {message}"
        OUTCOMES[what, "error"] += 1
        result = None
    else:
        OUTCOMES[what, "ok"] += 1
    elapsed = time.perf_counter() - t0
    assert elapsed < SLOW_S, f"{what}: took {elapsed:.1f} s"
    return result
