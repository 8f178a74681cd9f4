"""Certification: rule packs (data), the checks behind verdicts, MLLOG compliance.

    from ampcert.certify import load_rules, evaluate
    cert = evaluate(results.load(DIR).runs, load_rules("default"))
"""

from ampcert.certify.checks import Certificate, Verdict, evaluate, format_certificate
from ampcert.certify.rules import RulePack, load_rules

__all__ = ["Certificate", "RulePack", "Verdict", "evaluate", "format_certificate", "load_rules"]
