"""The finding kinds: the contract's (CONTRACT §6), and the ones this project adds.

Named for the analyzer, the simulator, the report and ``--fail-on``; declared, with their
severities and rules, in the registry (``hybridtrace.analyze.rules``).
"""

from hybridtrace.analyze.rules import ALL_KINDS, CONTRACT_KINDS, NATIVE_KINDS, VERIFY_KINDS

KINDS = CONTRACT_KINDS
# Added by this project, from native metrics (engine scope): block rounding hides the
# padding, and intervals no reading of the byte model explains.
EXTRA_KINDS = NATIVE_KINDS
# VERIFY_KINDS: added by this project, from `hybridtrace verify` results: the simulator has
# no outputs to compare, so they are not among the injectable ones.
# Kinds with a rule of their own, finding_<kind>, among those of the contract and verify.
RULED_KINDS = KINDS + VERIFY_KINDS
__all__ = ["ALL_KINDS", "EXTRA_KINDS", "KINDS", "RULED_KINDS", "VERIFY_KINDS", "parse_kinds"]


def parse_kinds(text: str, where: str) -> set[str]:
    """Finding kinds from "a,b,c" or "any"; an unknown kind is a usage error."""
    from hybridtrace.errors import UsageError

    if text.strip() == "any":
        return set(ALL_KINDS)
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    if not kinds:
        raise UsageError(f"{where}: no kinds given (list kinds, or 'any')")
    if "any" in kinds:
        raise UsageError(f"{where}: 'any' stands alone (it already means every kind)")
    bad = kinds - set(ALL_KINDS)
    if bad:
        raise UsageError(f"{where}: unknown kinds {sorted(bad)} (known: any, {', '.join(ALL_KINDS)})")
    return kinds
