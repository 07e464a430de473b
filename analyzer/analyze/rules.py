"""The finding-rule registry: every finding kind and every rule, declared once.

A *kind* is what a finding says (``padding_leak``): its severity, its docs page, whether
the contract defines it (the simulator injects those). A *rule* is one ``finding_<name>``
view of ``queries/``: the kinds it raises, its scope, the inputs it could see (counted in
``summary.rules``), the thresholds it reads. Most rules are named for the one kind they
raise; the native-metrics rules judge engines and intervals and raise the kinds the trace
rules raise per request.

The analyzer's list of views, the rule-inputs counts, ``hybridtrace.kinds``, the report's
kinds, ``explain``'s rules and the tables of ``docs/findings.md`` come from here;
``tests/test_rule_registry.py`` fails when a rule lacks its view, its docs page or a test.
The module itself imports only the standard library (the simulator and the CLI's option
parsing read it).
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")

# The ten columns every finding view returns, in this order: analyze's table, its JSON
# output and the report read them by name. (name, DuckDB type, doc)
FINDING_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("kind", "VARCHAR", "the finding kind (docs/findings/<kind>.md)"),
    ("severity", "VARCHAR", "'error', 'warning' or 'info'"),
    ("engine_id", "VARCHAR", "the engine it concerns: the decode engine for request and pair scopes"),
    ("rank", "INTEGER", "the decode TP rank, for rank-scoped findings; else null"),
    ("request_id", "VARCHAR", "the decode-side request id, for request-scoped findings; else null"),
    ("remote_engine_id", "VARCHAR", "the prefill engine, when known"),
    ("start_ts", "DOUBLE", "start of the time span an engine-scope finding rests on (epoch s); else null"),
    ("end_ts", "DOUBLE", "end of that span (epoch s); else null"),
    ("message", "VARCHAR", "one line a person can act on"),
    ("evidence", "VARCHAR", "JSON text with the numbers that prove it"),
)
FINDING_COLUMN_NAMES = tuple(name for name, _, _ in FINDING_COLUMNS)


@dataclass(frozen=True)
class Kind:
    name: str
    severity: str
    meaning: str
    origin: str  # 'contract' (CONTRACT §6; the simulator injects it), 'native' or 'verify'

    @property
    def doc(self) -> str:
        """Its docs page, relative to the repository (the package carries it as hybridtrace.docs)."""
        return f"docs/findings/{self.name}.md"


@dataclass(frozen=True)
class Rule:
    name: str  # the view is finding_<name>
    module: str  # the queries/ module that holds the view
    kinds: tuple[str, ...]  # the kinds it can raise
    scope: str  # what one finding is about: 'request', 'request + rank', 'engine + rank', ...
    inputs: str  # SQL: how many inputs the rule could see (0: it matched nothing)
    inputs_doc: str  # those inputs, in words
    thresholds: tuple[str, ...] = ()  # names in hybridtrace.analyze.thresholds
    basis: str = ""  # what it reads, when several rules raise one kind ('trace', 'counters', ...)
    # reads the other rules' findings (_handoff_findings): runs once they are in
    after_others: bool = False
    # (with after_others) every finding it raises is one of its inputs: with none counted, it
    # is not run, as its view would still read all it joins them to
    needs_inputs: bool = False
    # SQL counting what the rule's view needs in order to raise anything at all (the engines
    # of another kind it judges); at 0 the view is not run and its inputs count 0: the view
    # would read every row of the store only to join it to nothing
    requires: str = ""
    # tests that exercise it beside its cases under tests/cases/finding_<name>/, as
    # "tests/<file>.py::<test>" (a rule needs one or the other)
    tests: tuple[str, ...] = ()

    @property
    def view(self) -> str:
        return f"finding_{self.name}"


KIND_LIST: tuple[Kind, ...] = (
    Kind("padding_leak", "warning", "the recurrent state crossed as padded allocator pages", "contract"),
    Kind("staging_copy", "warning", "reads went through a host staging buffer (device↔host copies), or moved "
         "more than even the padded pages explain", "contract"),
    Kind("useless_boundary", "warning", "attention KV arrived past the state boundary and was recomputed",
         "contract"),
    Kind("slow_rank", "warning", "one decode rank reads persistently slower than its peers and sets the "
         "critical path", "contract"),
    Kind("descriptor_bound", "warning", "posting descriptors took most of the transfer time", "contract"),
    Kind("kv_expired", "error", "the prefill engine released the blocks before the decoder read them",
         "contract"),
    Kind("transfer_failed", "error", "a NIXL read failed", "contract"),
    Kind("unsharded_state", "warning", "a rank pulled far more recurrent state than its TP shard, not as "
         "padding", "contract"),
    Kind("config_mismatch", "error", "a prefill/decode pair disagrees on what a direct transfer needs "
         "(dtypes, layout, block size, Mamba mode, TP shape), or failed the compatibility hash", "contract"),
    Kind("recompute_cheaper", "warning", "the transfer's critical path exceeded the decoder's prefill time "
         "for the same prefix", "contract"),
    Kind("padding_undecidable", "info", "native metrics cannot tell padded from unpadded state (block "
         "rounding hides it)", "native"),
    Kind("native_unexplained", "warning", "native interval bytes fit no reading of the engine's byte model",
         "native"),
    Kind("reported_bytes_excess", "warning", "a TensorRT-LLM or SGLang rank reported sending more bytes "
         "than the request's tokens and state explain (the engine's own count, held against the byte model)",
         "native"),
    Kind("output_mismatch", "error", "the P/D deployment's greedy output parted from a colocated control's, "
         "not at a near tie (`hybridtrace verify`)", "verify"),
)  # fmt: skip

_NATIVE_INTERVALS = "SELECT count(*) FROM _untraced_interval_bytes"
_NATIVE_DOC = "intervals of engines the trace does not cover that the byte model sizes"

# In the order `summary.rules` lists them.
RULES: tuple[Rule, ...] = (
    # a read whose request does not give T has no byte counts: the rules cannot see it
    Rule("padding_leak", "findings_requests", ("padding_leak",), "request",
         "SELECT reads_sized FROM _accounting_totals", "successful reads with byte counts",
         ("excess_min_bytes",), basis="trace"),
    Rule("unsharded_state", "findings_requests", ("unsharded_state",), "request + rank",
         "SELECT reads_sized FROM _accounting_totals", "successful reads with byte counts",
         ("excess_min_bytes", "unsharded_factor")),
    Rule("staging_copy", "findings_requests", ("staging_copy",), "request",
         "SELECT transfers FROM _input_counts", "reads", ("excess_min_bytes", "unsharded_factor")),
    Rule("useless_boundary", "findings_requests", ("useless_boundary",), "request",
         "SELECT requests_with_tokens FROM _input_counts",
         "requests that say how many tokens crossed"),
    Rule("descriptor_bound", "findings_requests", ("descriptor_bound",), "request",
         "SELECT transfers_ok FROM _input_counts", "successful reads",
         ("descriptor_post_share",)),
    Rule("transfer_failed", "findings_requests", ("transfer_failed",), "request + rank",
         "SELECT transfers + log_events FROM _input_counts",
         "reads and log events", basis="named"),
    Rule("kv_expired", "findings_requests", ("kv_expired",), "request",
         "SELECT requests + log_events FROM _input_counts",
         "requests and log events", basis="named"),
    Rule("recompute_cheaper", "findings_requests", ("recompute_cheaper",), "request",
         "SELECT (SELECT handoffs FROM _timed_prefill_handoffs)"
         " + (SELECT count(*) FROM _fitted_handoffs WHERE prefill_s IS NOT NULL)",
         "handoffs with a prefill time (measured, or predicted by the fitted link)",
         ("recompute_margin", "prefill_tokens_per_s"),
         tests=("tests/test_link_fit.py::test_a_handoff_only_the_rings_measured_is_judged_by_their_fit",)),
    Rule("slow_rank", "findings_engines", ("slow_rank",), "engine + rank",
         "SELECT count(*) FROM _rank_windows WHERE peer_median_gb_s IS NOT NULL",
         "rank windows with peers to compare with",
         ("slow_rank_ratio", "slow_rank_windows", "slow_rank_min_reads", "window_s", "slow_rank_fit_ratio")),
    Rule("config_mismatch", "findings_engines", ("config_mismatch",), "engine pair",
         "SELECT count(*) FROM _config_pairs", "engine pairs that exchanged KV or tried to"),
    # each judges the intervals it counts as inputs, grouped per engine: with none (every engine
    # with native metrics is traced), it raises nothing
    Rule("native_padding", "native_bytes", ("padding_leak", "padding_undecidable"), "engine",
         _NATIVE_INTERVALS, _NATIVE_DOC, basis="native metrics", requires=_NATIVE_INTERVALS),
    Rule("native_unexplained", "native_bytes", ("native_unexplained",), "engine",
         _NATIVE_INTERVALS, _NATIVE_DOC, requires=_NATIVE_INTERVALS),
    Rule("native_counters", "native_bytes", ("transfer_failed", "kv_expired"), "engine",
         "SELECT count(*) FROM intervals", "intervals", basis="counters",
         tests=("tests/test_native_bytes.py::test_failures_only_the_counters_saw_are_reported",)),
    # judged per sending rank of another engine's request: those requests are not vLLM's
    # decode-side handoffs, so the scope does not start with 'request' (no _handoff_findings)
    Rule("reported_bytes_excess", "findings_other_engines", ("reported_bytes_excess",),
         "sending rank + request", "SELECT count(*) FROM reported_bytes WHERE unsized IS NULL",
         "TensorRT-LLM and SGLang ranks' reported byte counts the byte model sizes",
         ("link_bytes_per_s",), requires="SELECT count(*) FROM _other_engines"),
    # the outputs compared: a prompt that got no answer was not
    Rule("output_mismatch", "findings_verify", ("output_mismatch",), "request",
         "SELECT count(*) FROM verifications WHERE status <> 'error'", "outputs compared", after_others=True,
         needs_inputs=True,
         tests=("tests/test_verify.py::"
                "test_finds_exactly_the_divergent_prompts_labels_near_ties_and_joins_their_handoffs",)),
)  # fmt: skip

KINDS_BY_NAME = {k.name: k for k in KIND_LIST}
RULES_BY_NAME = {r.name: r for r in RULES}

# The kinds as hybridtrace.kinds has always named them.
CONTRACT_KINDS = tuple(k.name for k in KIND_LIST if k.origin == "contract")
NATIVE_KINDS = tuple(k.name for k in KIND_LIST if k.origin == "native")
VERIFY_KINDS = tuple(k.name for k in KIND_LIST if k.origin == "verify")
ALL_KINDS = tuple(k.name for k in KIND_LIST)


def rules_raising(kind: str) -> tuple[Rule, ...]:
    return tuple(r for r in RULES if kind in r.kinds)


def request_rules(*, after_others: bool | None = None) -> tuple[Rule, ...]:
    """Rules whose findings name a request, in the order of their kinds (``explain`` lists their
    findings; ``_handoff_findings`` unions those that do not read the others' findings)."""
    chosen = [
        r for r in RULES
        if r.scope.startswith("request") and (after_others is None or r.after_others == after_others)
    ]  # fmt: skip
    return tuple(sorted(chosen, key=lambda r: ALL_KINDS.index(r.kinds[0])))


def kind_scope(kind: str) -> str:
    """A kind's scope as docs/findings.md says it: each rule's, with what it reads when several raise it."""
    rules = rules_raising(kind)
    if len(rules) == 1:
        return rules[0].scope
    return "; ".join(f"{r.scope} ({r.basis})" if r.basis else r.scope for r in rules)


def report_kinds(found: dict[str, int]) -> list[str]:
    """The kinds a report lists: the contract's, in their order, then every other kind the
    analysis counted (``summary.findings_by_kind``), by name."""
    return [*CONTRACT_KINDS, *sorted(k for k in found if k not in CONTRACT_KINDS)]


def kinds_table() -> str:
    """The kinds table of docs/findings.md."""
    lines = ["| kind | scope | severity | meaning |", "|---|---|---|---|"]
    for k in KIND_LIST:
        link = f"[{k.name}](findings/{k.name}.md)"
        lines.append(f"| {link} | {kind_scope(k.name)} | {k.severity} | {k.meaning} |")
    return "\n".join(lines) + "\n"


def rules_table() -> str:
    """The rules table of docs/findings.md: view, kinds, scope, inputs counted, thresholds."""
    lines = ["| rule (view) | kinds | scope | inputs counted | thresholds |", "|---|---|---|---|---|"]
    for r in RULES:
        kinds = ", ".join(r.kinds)
        thresholds = ", ".join(f"`{t}`" for t in r.thresholds) or "—"
        lines.append(f"| `{r.view}` (`queries/{r.module}.sql`) | {kinds} | {r.scope} | {r.inputs_doc} "
                     f"| {thresholds} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def thresholds_table() -> str:
    """The thresholds table of docs/findings.md: default, meaning and the rules that read each."""
    from hybridtrace.analyze.thresholds import THRESHOLDS

    lines = ["| threshold | default | meaning | used by |", "|---|---|---|---|"]
    for t in THRESHOLDS:
        users = ", ".join(r.name for r in RULES if t.name in r.thresholds)
        lines.append(f"| `{t.name}` | {t.default:g} | {t.doc} | {users} |")
    return "\n".join(lines) + "\n"


GENERATED = {"kinds": kinds_table, "rules": rules_table, "thresholds": thresholds_table}


def with_generated_tables(text: str) -> str:
    """``text`` (docs/findings.md) with each ``<!-- generated: NAME -->`` … ``<!-- end: NAME -->``
    block replaced by the table the registry gives; a missing marker is an error."""
    for name, build in GENERATED.items():
        start, end = f"<!-- generated: {name} -->\n", f"<!-- end: {name} -->"
        head, found, rest = text.partition(start)
        if not found or end not in rest:
            raise ValueError(f"docs/findings.md: no {start.strip()} … {end} block")
        text = head + start + build() + rest[rest.index(end) :]
    return text
