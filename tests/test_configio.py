"""One YAML file reader for the harness's config files (configio.read_yaml_file): the suite,
pricing, rule packs, compliance rules and gate settings fail alike, in one line naming the file."""

from __future__ import annotations

import pytest

from ampcert.certify.compliance import load_compliance_rules
from ampcert.certify.rules import load_rules
from ampcert.errors import UserError
from ampcert.gate.settings import load_gate
from ampcert.spec import load_suite

READERS = {"suite": load_suite, "rule pack": load_rules, "compliance rules": load_compliance_rules,
           "gate settings": load_gate}


@pytest.mark.parametrize("name", list(READERS))
def test_every_config_reader_words_a_broken_file_alike(name, tmp_path):
    read = READERS[name]
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nrules: [a, b\n")
    with pytest.raises(UserError, match=r"broken\.yaml: malformed YAML at line \d+, column \d+: "):
        read(broken)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(UserError, match=r"binary\.yaml: cannot read .*utf-8"):
        read(binary)
    if name != "suite":  # a suite's top level is checked by its own model, field by field
        listed = tmp_path / "listed.yaml"
        listed.write_text("- a\n- b\n")
        with pytest.raises(UserError, match=r"listed\.yaml: expected a mapping of .* at the top level, got list"):
            read(listed)
