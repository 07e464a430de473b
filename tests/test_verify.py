"""`hybridtrace verify` against two real HTTP servers on loopback that answer as vLLM does.

The control plays a colocated vLLM; the other plays the P/D deployment behind its proxy,
which parts from the control after chosen tokens for chosen prompts and meets a near tie
for another. The store's trace is written the way the connector writes it for those
requests (vLLM's engine id is the API's id plus "-" and 8 random characters; the API's id
is the record's external_request_id), so the join is the one a deployment makes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai_servers import Behaviour, FakeVllm
from tracegen import engine_record, record, release_record, write_jsonl

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.report import write_report
from hybridtrace.store import Store
from hybridtrace.verify_compare import Output, compare

SCRIPT = Path(sys.executable).with_name("hybridtrace")
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
PD_KEY = "sk-pd-" + "7f3a9c1e5b2d4a6f8e0c"
CONTROL_KEY = "sk-control-" + "b1d3f5a7c9e2"
MODEL = "nvidia/NVIDIA-Nemotron-Nano-12B-v2"

PROMPTS = [
    {"id": "early", "prompt": "the decoder resumed from the wrong state at once"},
    {"id": "late", "prompt": "a boundary off by one shows a few tokens in"},
    {"id": "tie", "prompt": "two candidates all but equally likely"},
    {"id": "flaky", "prompt": "the router answers 500 twice before it answers"},
    {"id": "plain-1", "prompt": "nothing wrong with this handoff"},
    {"id": "plain-2", "prompt_token_ids": [101, 2023, 2003, 1037, 3231, 102]},
    {"prompt": "a prompt without an id"},
]
BEHAVIOURS = {
    "the decoder resumed from the wrong state at once": Behaviour(diverge_at=0),
    "a boundary off by one shows a few tokens in": Behaviour(diverge_at=5),
    "two candidates all but equally likely": Behaviour(tie_at=3),
    "the router answers 500 twice before it answers": Behaviour(fail_times=2),
}


def run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    # no key of the caller's environment leaks in: each test says which it sets
    environment = {k: v for k, v in os.environ.items()
                   if k != "HYBRIDTRACE_DEBUG" and not k.endswith("_API_KEY")}  # fmt: skip
    environment.update(env or {})
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, env=environment, timeout=timeout)


def keys() -> dict[str, str]:
    return {"HYBRIDTRACE_PD_API_KEY": PD_KEY, "HYBRIDTRACE_CONTROL_API_KEY": CONTROL_KEY}


def prompts_file(path: Path, prompts: list[dict]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def trace_of(
    pd: FakeVllm, folder: Path, *, failed_read: str | None = None, expired: str | None = None
) -> None:
    """The connector trace of the P/D deployment's answers: a decode and a prefill engine, TP 2.

    Each answer is a decode request whose engine id is the API's id plus "-" and 8 random
    hex characters (as vLLM makes it), with the API's id as external_request_id, and its
    two reads. ``failed_read``: the answer whose rank-1 read failed; ``expired``: the one
    whose prefill blocks were also released on lease expiry.
    """
    decode, released = [engine_record("decode-0", "decode", 2)], []
    prefill = [engine_record("prefill-0", "prefill", 2)]
    for n, served in enumerate(pd.answers):
        ts = 1764400100.0 + n
        internal = f"{served.response_id}-{secrets.token_hex(4)}"
        remote = f"{served.response_id}-{secrets.token_hex(4)}"
        missing = served.prompt_tokens - 1
        for rank in (0, 1):
            status = "failed" if served.key == failed_read and rank == 1 else "ok"
            decode.append(record(
                "transfer", ts=ts + rank * 1e-4, request_id=internal, remote_request_id=remote,
                engine_id="decode-0", remote_engine_id="prefill-0", rank=rank, tp_size=2, remote_rank=rank,
                remote_tp_size=2, status=status, post_s=0.0005, xfer_s=0.004 + rank * 0.001,
                bytes=missing * 3072 + 9433088 + rank, descriptors=100, staging_bytes=0, link="rdma:mlx5_0",
            ))  # fmt: skip
        decode.append(record(
            "request", ts=ts + 0.05, request_id=internal, remote_request_id=remote, engine_id="decode-0",
            remote_engine_id="prefill-0", prompt_tokens=served.prompt_tokens, cached_tokens=0,
            missing_tokens=missing, transferred_tokens=missing, reused_tokens=missing, recomputed_tokens=1,
            state_blocks=1, boundary_tokens=missing, status="ok", external_request_id=served.response_id,
        ))  # fmt: skip
        if served.key == expired:
            released.append(release_record("prefill-0", remote, ts + 0.02))
    write_jsonl(folder / "decode-0" / "trace.jsonl", decode)
    write_jsonl(folder / "prefill-0" / "trace.jsonl", prefill + released)


def rows_by_prompt(store: Path) -> dict[str, dict]:
    con = Store(store).connect()
    relation = con.sql("SELECT * FROM verifications")
    out = {}
    for values in relation.fetchall():
        row = dict(zip(relation.columns, values, strict=True))
        out[row["prompt_id"] or f"#{row['prompt_index']}"] = row
    return out


def every_byte_under(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_finds_exactly_the_divergent_prompts_labels_near_ties_and_joins_their_handoffs(tmp_path):
    store = tmp_path / "store"
    with FakeVllm("control", model=MODEL, behaviours=BEHAVIOURS) as control, \
         FakeVllm("pd", model=MODEL, behaviours=BEHAVIOURS, lists_models=False) as pd:  # fmt: skip
        # the P/D is reached through a router that serves completions only, as vLLM's proxy does
        done = run("verify", "--pd", pd.url + "/v1", "--control", control.url, "--store", str(store),
                   "--prompts", str(prompts_file(tmp_path / "p.jsonl", PROMPTS)), "--max-tokens", "16",
                   "--fail-on", "mismatch", "--progress", env=keys())  # fmt: skip
        # the servers were asked greedily, with logprobs and each side's own key
        assert {b["temperature"] for b in pd.bodies + control.bodies} == {0.0}
        assert all(b["logprobs"] == 5 and b["echo"] is False and b["seed"] == 0 for b in pd.bodies)
        assert set(pd.authorization) == {f"Bearer {PD_KEY}"}
        assert set(control.authorization) == {f"Bearer {CONTROL_KEY}"}
        # the flaky prompt: two 500s, then an answer, on each side
        assert sum(1 for b in pd.bodies if b["prompt"] == PROMPTS[3]["prompt"]) == 3
        trace_of(pd, tmp_path / "trace", failed_read=PROMPTS[0]["prompt"], expired=PROMPTS[0]["prompt"])
        answered = {s.key: s.response_id for s in pd.answers}
    assert done.returncode == 1, done.stderr  # a mismatch, and --fail-on mismatch
    assert "early" in done.stdout and "near_tie" in done.stdout
    assert "hybridtrace verify: 7/7 prompts" in done.stderr and "HTTP 500; try 2 of 4" in done.stderr

    rows = rows_by_prompt(store)
    assert {k: r["status"] for k, r in rows.items()} == {
        "early": "mismatch", "late": "mismatch", "tie": "near_tie", "flaky": "match",
        "plain-1": "match", "plain-2": "match", "#6": "match",
    }  # fmt: skip
    assert rows["early"]["first_divergence"] == 0 and rows["late"]["first_divergence"] == 5
    assert rows["late"]["max_logprob_diff"] == pytest.approx(1e-4, abs=1e-6)  # drift, not divergence
    assert rows["tie"]["first_divergence"] == 3 and rows["tie"]["control_top_gap"] == pytest.approx(0.004)
    assert rows["late"]["control_top_gap"] > 1.0 and rows["late"]["pd_token_control_logprob"] is None
    assert rows["flaky"]["pd_attempts"] == 3 and rows["flaky"]["control_attempts"] == 3
    assert rows["plain-2"]["prompt_kind"] == "token_ids" and rows["plain-2"]["prompt_tokens"] == 6
    assert all(r["tokens_compared"] == 16 for r in rows.values())
    assert rows["early"]["pd_response_id"] == answered[PROMPTS[0]["prompt"]]

    # the trace arrives as a deployment's would: ingested after the fact, joined by the API id
    ingest([tmp_path / "trace"], store)
    result = analyze(Store(store).connect())
    mismatches = [f for f in result.findings if f["kind"] == "output_mismatch"]
    assert sorted(f["evidence"]["prompt_id"] for f in mismatches) == ["early", "late"]
    assert result.summary["findings_by_kind"]["output_mismatch"] == 2
    assert result.summary["rules"]["output_mismatch"]["inputs"] == 7
    for finding in mismatches:
        evidence = finding["evidence"]
        api_id = evidence["pd_response_id"]
        assert finding["severity"] == "error" and finding["engine_id"] == "decode-0"
        assert finding["request_id"] != api_id and finding["request_id"].startswith(api_id + "-")
        assert len(finding["request_id"]) == len(api_id) + 9 and finding["remote_engine_id"] == "prefill-0"
        assert evidence["in_trace"] and evidence["reads"] == 2 and evidence["ranks"] == [0, 1]
        reads = evidence["per_read"]
        missing = evidence["missing_tokens"]
        assert [r["bytes"] for r in reads] == [missing * 3072 + 9433088, missing * 3072 + 9433089]
        assert evidence["state_blocks"] == 1 and evidence["boundary_tokens"] == missing
    early = next(f for f in mismatches if f["evidence"]["prompt_id"] == "early")
    assert early["evidence"]["handoff_findings"] == ["kv_expired", "transfer_failed"]
    assert early["evidence"]["reads_not_ok"] == 1
    assert [r["status"] for r in early["evidence"]["per_read"]] == ["ok", "failed"]
    assert "kv_expired, transfer_failed" in early["message"]
    late = next(f for f in mismatches if f["evidence"]["prompt_id"] == "late")
    assert late["evidence"]["handoff_findings"] == [] and "token 5 of 16" in late["message"]
    # explain shows the finding on the handoff, by the decode-side id
    shown = json.loads(run("explain", early["request_id"], "--store", str(store), "--format", "json").stdout)
    assert "output_mismatch" in {f["kind"] for f in shown["findings"]}
    assert [(v["prompt_id"], v["status"]) for v in shown["verifications"]] == [("early", "mismatch")]

    page, _ = write_report(store, tmp_path / "report.html")
    html = page.read_text()
    assert 'id="verifications"' in html and 'id="doc-output_mismatch"' in html
    assert answered[PROMPTS[0]["prompt"]] in html and "near tie" in html
    # nothing of a prompt or an answer, and no key, in what verify printed, stored or reported
    for where in (done.stdout + done.stderr, html, every_byte_under(store).decode("latin-1")):
        assert PD_KEY not in where and CONTROL_KEY not in where
        assert not any(p["prompt"] in where for p in PROMPTS if "prompt" in p)


def test_a_server_that_hangs_costs_its_prompt_and_the_run_goes_on(tmp_path):
    hang = {"this one never comes back": Behaviour(hang=True)}
    prompts = [{"id": "stuck", "prompt": "this one never comes back"}, {"id": "ok-1", "prompt": "one"},
               {"id": "ok-2", "prompt": "two"}]  # fmt: skip
    with FakeVllm("control") as control, FakeVllm("pd", behaviours=hang) as pd:
        started = time.monotonic()
        done = run("verify", "--pd", pd.url, "--control", control.url, "--store", str(tmp_path / "s"),
                   "--prompts", str(prompts_file(tmp_path / "p.jsonl", prompts)), "--timeout", "1",
                   "--retries", "1")  # fmt: skip
        took = time.monotonic() - started
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "1 of 3 prompts could not be compared" in done.stderr and "timed out" in done.stderr
    assert took < 30
    rows = rows_by_prompt(tmp_path / "s")
    assert rows["stuck"]["status"] == "error" and "P/D deployment timed out" in rows["stuck"]["error"]
    assert rows["stuck"]["pd_attempts"] == 1  # a hang is not retried: each try costs a generation
    assert rows["ok-1"]["status"] == rows["ok-2"]["status"] == "match"


CASES = ["wrong url", "model mismatch", "model mismatch behind a proxy", "logprobs ignored",
         "bad prompt line"]


@pytest.mark.parametrize("case", CASES)
def test_clear_errors_exit_2_in_one_line(tmp_path, case):
    good = prompts_file(tmp_path / "p.jsonl", [{"id": "a", "prompt": "hello there"}])
    control_model = "acme/other-model" if case.startswith("model mismatch") else MODEL
    with FakeVllm("control", model=control_model) as control, \
         FakeVllm("pd", model=MODEL, ignore_logprobs=case == "logprobs ignored",
                  lists_models=case != "model mismatch behind a proxy") as pd:  # fmt: skip
        pd_url = pd.url
        if case == "wrong url":
            from servers import free_port

            pd_url = f"http://127.0.0.1:{free_port()}"
        prompts = good
        if case == "bad prompt line":
            prompts = tmp_path / "bad.jsonl"
            prompts.write_text('{"prompt": "fine"}\n{"prompt_token_ids": [1, -2]}\n')
        done = run("verify", "--pd", pd_url, "--control", control.url, "--store", str(tmp_path / "s"),
                   "--prompts", str(prompts), "--retries", "1", env=keys())  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    expected = {
        "wrong url": "cannot reach the P/D deployment",
        "model mismatch": "model mismatch: the P/D deployment serves",
        "model mismatch behind a proxy": "model mismatch: the P/D deployment does not serve 'acme/other",
        "logprobs ignored": "the P/D deployment at http://127.0.0.1",
        "bad prompt line": "bad.jsonl line 2: prompt_token_ids must be",
    }[case]
    assert expected in done.stderr, done.stderr
    if case == "logprobs ignored":
        assert "ignored logprobs" in done.stderr
    assert PD_KEY not in done.stderr + done.stdout and CONTROL_KEY not in done.stderr + done.stdout


def test_without_a_prompt_file_prompts_are_built_at_the_traffics_missing_prefix_lengths(tmp_path):
    store = tmp_path / "store"
    # traffic: 40 requests with known missing-prefix lengths, and the model's config
    lengths = [100 + 37 * i for i in range(40)]
    records = [engine_record("decode-0", "decode", 2)]
    for i, missing in enumerate(lengths):
        records.append(record(
            "request", ts=1764400100.0 + i, request_id=f"r{i}", remote_request_id=f"p{i}",
            engine_id="decode-0", remote_engine_id="prefill-0", prompt_tokens=missing + 1, cached_tokens=0,
            missing_tokens=missing,
            transferred_tokens=missing, reused_tokens=missing, recomputed_tokens=1, state_blocks=1,
            boundary_tokens=missing, status="ok",
        ))  # fmt: skip
    write_jsonl(tmp_path / "trace" / "decode-0" / "trace.jsonl", records)
    ingest([tmp_path / "trace"], store, model="nemotron-nano-12b-v2")
    con = Store(store).connect()
    p50, p95, top = con.sql("SELECT quantile_disc(missing_tokens, 0.5), quantile_disc(missing_tokens, 0.95), "
                            "max(missing_tokens) FROM requests").fetchall()[0]  # fmt: skip
    with FakeVllm("control", model=MODEL) as control, FakeVllm("pd", model=MODEL) as pd:
        done = run("verify", "--pd", pd.url, "--control", control.url, "--store", str(store),
                   "--max-tokens", "8", "--format", "json")  # fmt: skip
        sent = [b["prompt"] for b in pd.bodies]
    assert done.returncode == 0, done.stderr
    # one token more than each missing prefix: vLLM's decoder computes the last one itself
    assert sorted(len(p) for p in sent) == sorted([p50 + 1, p95 + 1, top + 1])
    assert all(isinstance(t, int) and 0 <= t < 131072 for p in sent for t in p)  # below the vocabulary
    summary = json.loads(done.stdout)
    assert summary["by_status"]["match"] == 3
    assert {r["prompt_id"]: r["missing_tokens_target"] for r in summary["results"]} == {
        "p50": p50, "p95": p95, "max": top}  # fmt: skip

    empty = tmp_path / "empty"
    ingest([], empty)
    with FakeVllm("control", model=MODEL) as control, FakeVllm("pd", model=MODEL) as pd:
        refused = run("verify", "--pd", pd.url, "--control", control.url, "--store", str(empty))
    assert refused.returncode == 2 and "no traffic" in refused.stderr and "Traceback" not in refused.stderr


def test_a_killed_verify_leaves_a_readable_store_with_what_it_committed(tmp_path):
    store = tmp_path / "store"
    prompts = [{"id": f"q{i}", "prompt": f"prompt number {i}"} for i in range(6)]
    hang = {"prompt number 4": Behaviour(hang=True)}
    with FakeVllm("control") as control, FakeVllm("pd", behaviours=hang) as pd:
        command = [*COMMAND, "verify", "--pd", pd.url, "--control", control.url, "--store", str(store),
                   "--prompts", str(prompts_file(tmp_path / "p.jsonl", prompts)), "--concurrency", "1",
                   "--timeout", "60"]  # fmt: skip
        env = {**os.environ, "HYBRIDTRACE_VERIFY_BATCH_ROWS": "1"}
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        committed = 0
        while time.monotonic() < deadline and committed < 4:
            time.sleep(0.2)
            if Store(store).exists():
                committed = Store(store).connect().sql("SELECT count(*) FROM verifications").fetchall()[0][0]
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert committed == 4
    con = Store(store).connect()  # readable; what was committed is there, once
    assert sorted(r[0] for r in con.sql("SELECT prompt_id FROM verifications").fetchall()) == [
        "q0", "q1", "q2", "q3"]  # fmt: skip
    assert con.sql("SELECT count(*) FROM sources WHERE format = 'verify'").fetchall()[0][0] == 4


def test_compare_tells_ties_from_divergences_and_a_stopped_side():
    def out(tokens, top, finish="length"):
        return Output(tokens, [max(t.values()) for t in top], top, finish)

    control = out(["a", "b", "c"], [{"a": -0.1}, {"b": -0.70, "x": -0.705}, {"c": -0.2, "y": -3.0}])
    tied = out(["a", "x", "z"], [{"a": -0.1}, {"x": -0.70, "b": -0.71}, {"z": -0.1}])
    assert compare(tied, control, 0.01).status == "near_tie"
    assert compare(tied, control, 0.001).status == "mismatch"  # the tolerance decides
    unseen = out(["a", "q", "z"], [{"a": -0.1}, {"q": -0.1}, {"z": -0.1}])
    result = compare(unseen, control, 0.01)
    assert result.status == "mismatch" and result.pd_token_control_logprob is None
    assert result.control_top_gap == pytest.approx(0.005)  # a close pair, but the P/D took neither
    short = out(["a", "b"], [{"a": -0.1}, {"b": -0.7}], finish="stop")
    stopped = compare(short, control, 0.01)
    assert stopped.status == "mismatch" and stopped.first_divergence == 2 and stopped.tokens_compared == 2
    same = compare(control, control, 0.01)
    assert same.status == "match" and same.first_divergence is None and same.max_logprob_diff == 0


def test_the_scheduled_job_runs_a_verify_step_with_its_own_alert_policy(tmp_path):
    from servers import free_port
    from tracegen import transfer_records

    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", transfer_records(5, tp=2))
    prompts = prompts_file(tmp_path / "p.jsonl", PROMPTS[:3])

    def job(name: str, verify: str) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f"""
[inputs]
paths = ["{tmp_path / 'in'}"]
[store]
path = "{tmp_path / name}"
[report]
html = "{tmp_path / name / 'report.html'}"
[verify]
{verify}
""")
        return path

    def run_job(path: Path) -> tuple[int, dict]:
        done = run("run", "--config", str(path), env=keys())
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1, (done.stdout, done.stderr)
        return done.returncode, json.loads(lines[0])

    with FakeVllm("control", model=MODEL, behaviours=BEHAVIOURS) as control, \
         FakeVllm("pd", model=MODEL, behaviours=BEHAVIOURS) as pd:  # fmt: skip
        urls = f'pd = "{pd.url}"\ncontrol = "{control.url}"\nprompts = "{prompts}"\nmax_tokens = 8\n'
        code, summary = run_job(job("alerting", urls + 'fail_on = ["mismatch"]'))
        assert code == 1 and summary["status"] == "output mismatch", summary
        step = summary["verify"]
        assert (step["prompts"], step["mismatch"], step["near_tie"], step["match"]) == (3, 2, 1, 0)
        assert step["fail_on_matched"] == ["mismatch"]
        # the analysis ran after the step: its findings and the report hold this run's comparisons
        assert summary["by_kind"]["output_mismatch"] == 2
        assert 'id="verifications"' in (tmp_path / "alerting" / "report.html").read_text()
        # without fail_on the step records and alerts on nothing; near ties alone never alert
        code, summary = run_job(job("quiet", urls))
        assert code == 0 and summary["status"] == "ok" and summary["verify"]["mismatch"] == 2
    # a server that cannot be reached: exit 2, and the rest of the run still happened
    gone = f'pd = "http://127.0.0.1:{free_port()}"\ncontrol = "http://127.0.0.1:{free_port()}"\nretries = 0\n'
    code, summary = run_job(job("down", gone + f'prompts = "{prompts}"'))
    assert code == 2 and summary["status"] == "verify error" and "cannot reach" in summary["message"]
    assert (tmp_path / "down" / "report.html").exists() and summary["objects"]["read"] == 1
    code, summary = run_job(job("typo", urls.replace("max_tokens", "max_token")))
    assert code == 2 and summary["status"] == "error" and "[verify] has unknown keys" in summary["message"]
