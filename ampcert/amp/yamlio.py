"""YAML that cannot hang or crash its reader: the one loader for every ampcert file.

``yaml.safe_load`` lets ValueError (``2024-13-01``, ``!!int x``), KeyError
(``!!bool maybe``) and RecursionError (deep nesting) through, and expands
aliases lazily, so a few lines can stand for more values than any reader can
walk. :func:`load_yaml` turns each of those into a ``yaml.YAMLError`` with a
one-line message. It lives in :mod:`ampcert.amp` because the policy loader
needs it and that package imports nothing of the harness; the harness (suites,
rule packs, gate settings, MLLOG rules) imports it from here.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["YAML_MAX_DEPTH", "YAML_MAX_VALUES", "load_yaml", "yaml_size_problem"]

# A hand-written suite, policy or rule file is far below these: past them
# lies a file that would hang (aliases expanding to billions of values) or
# crash (recursion) the code that reads it.
YAML_MAX_VALUES = 100_000
YAML_MAX_DEPTH = 50


def yaml_size_problem(data: Any, max_values: int = YAML_MAX_VALUES, max_depth: int = YAML_MAX_DEPTH) -> str | None:
    """Why ``data`` (parsed YAML, aliases expanded as a reader would see
    them) is too big or too deep to read, or None. Iterative: it cannot
    itself recurse too deeply, and it stops at the first limit crossed."""
    count, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > max_values:
            return f"more than {max_values} values once aliases are expanded"
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels (or an alias refers to itself)"
        if isinstance(node, dict):
            for k, v in node.items():
                stack += [(k, depth + 1), (v, depth + 1)]
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack += [(v, depth + 1) for v in node]
    return None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, with every way it can fail a ``yaml.YAMLError``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to parse") from None
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise yaml.YAMLError(f"a value its type or tag cannot hold ({type(exc).__name__}: {detail})") from None
    problem = yaml_size_problem(data)
    if problem:
        raise yaml.YAMLError(problem)
    return data
