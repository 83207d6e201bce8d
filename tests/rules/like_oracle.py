"""The oracle of the rule tests' LIKE checks: LIKE as it compiled before the linear matcher
(``%`` -> ``.*``, ``_`` -> ``.``, everything else literal, ``\\`` escaping the next character)."""

from __future__ import annotations

import re


def old_like_regex(pattern: str) -> str:
    """The backtracking regex a LIKE pattern used to compile to; match it with ``fullmatch``."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return "".join(out)
