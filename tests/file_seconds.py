"""Write tests/file_seconds.json from a pytest JUnit XML: each test file's seconds (its tests'
setup, call and teardown summed), files of 5 s or more, longest first. conftest.py orders
the files by it, so pytest-xdist starts the longest first (see pytest_configure there).

    python tests/file_seconds.py ci.xml
"""

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

seconds: Counter[str] = Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    seconds[case.get("classname", "").replace(".", "/") + ".py"] += float(case.get("time", 0))
out = {name: round(s) for name, s in seconds.most_common() if s >= 5}
(Path(__file__).parent / "file_seconds.json").write_text(json.dumps(out, indent=1) + "\n")
