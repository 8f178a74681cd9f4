"""The marks ampcert's torch AMP gives Dynamo, applied when torch._dynamo is imported.

Some functions of the autocast and the scaler tell torch.compile how to treat them: run
once for real while tracing (``assume_constant_result``), become a node of the graph
(``allow_in_graph``), run eagerly (``torch.compiler.disable``), or never be compiled as a
frame of their own (``tracing.never_compiled_alone``). Applied at import,
each imports torch._dynamo, and with it torch._inductor and sympy (about 1.5 s and
100 MB), into every program that uses an eager region, which never meets Dynamo.

Nothing can be compiled before torch._dynamo is imported (``torch.compile`` imports it),
so the marks wait for it: :func:`when_dynamo_imported` runs its function the moment the
module has been imported (at once, where it was already), through wrapt's post-import
hooks. A mark that makes a new object (``torch.compiler.disable``'s wrapper) rebinds the
attribute its callers look up at each call (``DynamicLossScaler.step`` and ``.update``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import wrapt

DYNAMO = "torch._dynamo"


def when_dynamo_imported(mark: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """Run ``mark(torch._dynamo)`` once torch._dynamo is imported (now, if it is)."""
    wrapt.when_imported(DYNAMO)(mark)
    return mark


def constant_under_compile(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result`` for ``fn``, applied when Dynamo is imported
    (it marks ``fn`` itself, so callers keep the object they have)."""
    when_dynamo_imported(lambda dynamo: dynamo.assume_constant_result(fn))
    return fn
