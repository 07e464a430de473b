"""The finding kinds of the contract (CONTRACT §6), in one place for the analyzer and the simulator."""

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
