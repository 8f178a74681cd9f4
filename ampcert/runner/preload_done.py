"""The last module the forkserver preloads (local_executor._PRELOAD): it freezes what the
preload built.

``gc.freeze()`` moves every object alive now (torch, the harness, their modules) into the
collector's permanent generation, as the gc docs advise before forking: a worker forked
from the forkserver never scans them in a collection (nor writes to their pages, which
stay shared), and the forkserver's own exit, once ampcert's run ends, does not collect
them either (a second of CPU per ``ampcert run`` with torch loaded).
"""

import gc

gc.freeze()
