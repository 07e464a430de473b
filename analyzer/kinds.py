"""The finding kinds: the contract's (CONTRACT §6), and the ones this project adds.

In one place for the analyzer, the simulator, the report and ``--fail-on``.
"""

KINDS = (
    "padding_leak",
    "staging_copy",
    "useless_boundary",
    "slow_rank",
    "descriptor_bound",
    "kv_expired",
    "transfer_failed",
    "unsharded_state",
    "config_mismatch",
    "recompute_cheaper",
)

# Added by this project, from native metrics (engine scope): block rounding hides the
# padding, and intervals no reading of the byte model explains.
EXTRA_KINDS = ("padding_undecidable", "native_unexplained")
# Added by this project, from `hybridtrace verify` results: the simulator has no outputs to
# compare, so this kind is not among the injectable ones.
VERIFY_KINDS = ("output_mismatch",)
# Kinds with a rule of their own, finding_<kind>: the analyzer runs each.
RULED_KINDS = KINDS + VERIFY_KINDS
ALL_KINDS = KINDS + EXTRA_KINDS + VERIFY_KINDS


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
