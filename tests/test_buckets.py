"""Ingest from buckets: an S3 API server (moto), a GCS emulator and a local folder as the bucket.

The same story on each: ingest a prefix; re-run (nothing is read); add objects, change
one, delete one; re-run — the store then holds exactly what a local ingest of the same
history holds. Two runs at once do not corrupt the store, and a run killed mid-way is
completed by the next.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import servers
from loggen import decode_log, prefill_log
from promgen import scrape
from test_ingest_trace import _all_rows
from tracegen import transfer_records

import hybridtrace.store.leases as leases
import hybridtrace.store.roots as roots
from hybridtrace.errors import UsageError
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store
from hybridtrace.store.objects import ObjectRef

REQUIRE = os.environ.get("HYBRIDTRACE_REQUIRE_SERVERS") == "1"


def _jsonl(records: list[dict]) -> bytes:

    return "".join(json.dumps(r) + "\n" for r in records).encode()


def initial_objects() -> dict[str, bytes]:
    objects: dict[str, bytes] = {}
    for i in range(3):
        objects[f"engine-{i}/trace.jsonl"] = _jsonl(transfer_records(20, seed=i))
        objects[f"engine-{i}/vllm.log"] = (decode_log() * 3).encode()
        scraped = scrape([(0.01, 0.001, 5000, 9)] * (i + 1))
        objects[f"engine-{i}/metrics-20260421T1000{i:02d}Z.prom"] = scraped.encode()
    objects["prefill/vllm.log.1.gz"] = gzip.compress(prefill_log().encode() * 5)
    return objects


def changes() -> tuple[dict[str, bytes], list[str]]:
    """Objects to put (new ones, and engine-0's log grown), and objects to delete."""
    put = {
        "engine-3/trace.jsonl": _jsonl(transfer_records(20, seed=3)),
        "engine-3/vllm.log": (decode_log() * 2).encode(),
        "engine-0/vllm.log": (decode_log() * 5).encode(),
    }
    return put, ["engine-1/metrics-20260421T100001Z.prom"]


# The folder stands in for a bucket with no server: it runs by default, the two servers in their tier.
@pytest.fixture(params=[pytest.param("s3", marks=pytest.mark.servers),
                        pytest.param("gs", marks=pytest.mark.servers), "file"])
def server(request, tmp_path, monkeypatch):
    if request.param == "s3":
        if not REQUIRE:
            pytest.importorskip("moto.server")
        context = servers.moto_s3()
    elif request.param == "gs":
        if servers.fake_gcs_binary() is None and not REQUIRE:
            pytest.skip("fake-gcs-server is not installed")
        context = servers.fake_gcs()
    else:
        context = servers.local_folder(tmp_path / "bucket-root")
    with context as srv:
        for name, value in srv.env.items():
            monkeypatch.setenv(name, value)
        srv.make_bucket("telemetry")
        yield srv


def _mirror(folder: Path, objects: dict[str, bytes], deleted: list[str] = ()) -> None:
    for name, data in objects.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for name in deleted:
        (folder / name).unlink()


def test_prefix_added_changed_deleted(server, tmp_path):
    prefix = server.uri("telemetry/logs")
    first = initial_objects()
    for name, data in first.items():
        server.put(f"telemetry/logs/{name}", data)
    store = tmp_path / "store"
    summary = ingest([prefix], store)
    assert (summary.objects_read, summary.objects_skipped) == (len(first), 0)
    assert summary.rows["transfers"] == 3 * 20 * 2 and summary.rows["prom_samples"] > 0

    again = ingest([prefix], store)
    assert (again.objects_read, again.objects_skipped, again.rows) == (0, len(first), {})

    put, deleted = changes()
    for name, data in put.items():
        server.put(f"telemetry/logs/{name}", data)
    for name in deleted:
        server.delete(f"telemetry/logs/{name}")
    third = ingest([prefix], store)
    assert third.objects_read == len(put) and third.objects_gone == len(deleted)

    # the same history from a local folder
    local, expected = tmp_path / "mirror", tmp_path / "expected"
    _mirror(local, first)
    ingest([local], expected)
    _mirror(local, put, deleted)
    ingest([local], expected)
    got, want = _all_rows(store), _all_rows(expected)
    for table in want:
        assert got[table] == want[table], table
    gone = Store(store).connect().sql("SELECT uri FROM sources WHERE status = 'deleted'").fetchall()
    assert [uri.rsplit("/", 2)[-2:] for (uri,) in gone] == [deleted[0].split("/")]
    # noted once: the next run has nothing to say about it
    assert ingest([prefix], store).objects_gone == 0


def test_unchanged_objects_are_not_opened(server, tmp_path, monkeypatch):
    for name, data in initial_objects().items():
        server.put(f"telemetry/logs/{name}", data)
    ingest([server.uri("telemetry/logs")], tmp_path / "store")

    def refuse(self):
        raise AssertionError(f"{self.uri} was opened")

    monkeypatch.setattr(ObjectRef, "open", refuse)
    summary = ingest([server.uri("telemetry/logs")], tmp_path / "store")
    assert summary.objects_read == 0 and summary.objects_skipped == len(initial_objects())


def _command(prefix: str, store: Path) -> list[str]:
    return [sys.executable, "-m", "hybridtrace", "ingest", prefix, "--store", str(store), "-q"]


@pytest.mark.slow
def test_concurrent_runs_and_a_killed_run(server, tmp_path):
    objects = initial_objects()
    for name, data in objects.items():
        server.put(f"telemetry/logs/{name}", data)
    prefix, store = server.uri("telemetry/logs"), tmp_path / "store"
    # tiny batches: many commits, so a kill lands between some of them
    tiny = {"HYBRIDTRACE_BATCH_OBJECTS": "1", "HYBRIDTRACE_BATCH_ROWS": "20",
            "HYBRIDTRACE_CHUNK_BYTES": "2048"}  # fmt: skip
    env = servers.environ_with({**server.env, **tiny})
    runs = [subprocess.Popen(_command(prefix, store), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]  # fmt: skip
    for run in runs:
        _out, err = run.communicate(timeout=120)
        assert run.returncode == 0 or (run.returncode == 2 and "another ingest is writing" in err), err
        assert "Traceback" not in err
    Store(store).connect()

    killed = tmp_path / "killed"
    process = subprocess.Popen(_command(prefix, killed), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1.0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    Store(killed).connect()  # readable after the kill
    _must(_command(prefix, killed), env)
    _must(_command(prefix, store), env)

    local, clean = tmp_path / "mirror", tmp_path / "clean"
    _mirror(local, objects)
    ingest([local], clean)
    want = _all_rows(clean)
    for root in (store, killed):
        got = _all_rows(root)
        for table in want:
            assert got[table] == want[table], (root.name, table)


def _must(command: list[str], env: dict[str, str]) -> None:
    """Run an ingest that has to succeed; its error output is the failure message."""
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _must_once_leases_expire(command: list[str], env: dict[str, str], within_s: float = 60.0) -> None:
    """Run an ingest that has to succeed once every other writer's lease has expired.

    A dead or finished writer's lease lapses a lease period (fast_leases: 3 s) after its
    last renewal, as the store's clock reads it: on a loaded machine a fixed sleep can end
    before. The run is repeated while it steps aside for a lease still held (exit 2), up to
    ``within_s``, far longer than any lease; any other failure fails at once.
    """
    deadline = time.monotonic() + within_s
    while True:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        held = done.returncode == 2 and "another ingest is writing" in done.stderr
        if not held or time.monotonic() > deadline:
            assert done.returncode == 0, done.stderr
            return
        time.sleep(1.0)


def test_bad_bucket_uris_are_clear_and_keep_secrets(server, tmp_path):
    if server.scheme == "file":
        with pytest.raises(UsageError, match="no such file or folder"):
            ingest([server.uri("telemetry/nothing-here")], tmp_path / "store")
        return
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    with pytest.raises(UsageError) as refused:
        ingest([f"{server.scheme}://someone:{secret or 'hunter22'}@telemetry/logs"], tmp_path / "store")
    assert "refused" in str(refused.value) and (secret or "hunter22") not in str(refused.value)
    with pytest.raises(UsageError) as missing:
        ingest([server.uri("no-such-bucket")], tmp_path / "store")
    assert "no such bucket" in str(missing.value) or "cannot list" in str(missing.value)
    assert not secret or secret not in str(missing.value)
    # an empty prefix is no error: nothing to read yet
    assert ingest([server.uri("telemetry/empty")], tmp_path / "store").objects_seen == 0


@pytest.fixture
def fast_leases(monkeypatch):
    """Leases that settle and expire in seconds, so a killed run's lease is gone quickly."""
    quick = {"HYBRIDTRACE_LEASE_SETTLE_S": "0.3", "HYBRIDTRACE_LEASE_S": "3"}
    for name, value in quick.items():
        monkeypatch.setenv(name, value)
    return quick


def test_store_in_the_bucket(server, tmp_path, fast_leases):
    if server.scheme == "file":
        pytest.skip("a local store is every other test")
    from hybridtrace.report import collect, render_html

    objects = initial_objects()
    for name, data in objects.items():
        server.put(f"telemetry/logs/{name}", data)
    prefix, store = server.uri("telemetry/logs"), server.uri("telemetry/store")
    first = ingest([prefix], store)
    assert first.objects_read == len(objects)
    assert ingest([prefix], store).objects_read == 0  # the manifest in the bucket says: unchanged

    local, clean = tmp_path / "mirror", tmp_path / "clean"
    _mirror(local, objects)
    ingest([local], clean)
    want = _all_rows(clean)
    got = _all_rows(store)
    for table in want:
        assert got[table] == want[table], table
    html = render_html(collect(Store(store).connect(), store=store))
    assert "hybridtrace report" in html

    # a run killed mid-way leaves a readable store; once its lease expires, the next completes it
    killed = server.uri("telemetry/killed")
    tiny = {"HYBRIDTRACE_BATCH_OBJECTS": "1", "HYBRIDTRACE_BATCH_ROWS": "20",
            "HYBRIDTRACE_CHUNK_BYTES": "2048"}  # fmt: skip
    env = servers.environ_with({**server.env, **fast_leases, **tiny})
    process = subprocess.Popen(_command(prefix, killed), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(2.0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    Store(killed).connect()
    busy = subprocess.run(_command(prefix, killed), env=env, capture_output=True, text=True)
    assert busy.returncode in (0, 2) and "Traceback" not in busy.stderr
    _must_once_leases_expire(_command(prefix, killed), env)  # the dead run's lease expires
    got = _all_rows(killed)
    for table in want:
        assert got[table] == want[table], ("killed", table)

    # two runs at once: one writes, the other steps aside; the store stays whole
    both = server.uri("telemetry/both")
    runs = [subprocess.Popen(_command(prefix, both), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]  # fmt: skip
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0 or (run.returncode == 2 and "another ingest is writing" in err), err
    _must_once_leases_expire(_command(prefix, both), env)
    got = _all_rows(both)
    for table in want:
        assert got[table] == want[table], ("concurrent", table)


def test_same_content_uploaded_again_is_not_opened_again(server, tmp_path, monkeypatch):
    if server.scheme != "s3":
        pytest.skip("S3 keeps the ETag of identical content (GCS makes a new generation)")
    data = initial_objects()["engine-0/vllm.log"]
    server.put("telemetry/logs/vllm.log", data)
    ingest([server.uri("telemetry/logs")], tmp_path / "s")
    time.sleep(1.1)  # a new LastModified
    server.put("telemetry/logs/vllm.log", data)
    import hybridtrace.ingest.run as run

    fetched = []
    real_fetch = run._fetch
    monkeypatch.setattr(run, "_fetch", lambda obj: fetched.append(obj.uri) or real_fetch(obj))
    again = ingest([server.uri("telemetry/logs")], tmp_path / "s")
    assert (again.objects_read, again.objects_skipped) == (0, 1)  # opened, same ETag: skipped
    assert fetched == []  # same size: its head and version are read, not all of it

    def refuse(self):
        raise AssertionError("opened again")

    monkeypatch.setattr(ObjectRef, "open", refuse)
    assert ingest([server.uri("telemetry/logs")], tmp_path / "s").objects_skipped == 1


def _bucket_store(server, name: str) -> Store:
    """A new store under ``telemetry/<name>`` in the bucket; local folders use a file lock instead."""
    if server.scheme == "file":
        pytest.skip("local stores use a file lock")
    store = Store(server.uri(f"telemetry/{name}"))
    store.init()
    return store


def _claim_text(token: str, held: bool = True, expires_in: float = 60.0) -> str:
    """Another run's claim on a store's writer lease, as it would write it."""

    now = time.time()
    return json.dumps({"token": token, "host": "elsewhere", "pid": 1, "started": now,
                       "expires": now + expires_in, "held": held})  # fmt: skip


def _put_claim(server, store: str, token: str, held: bool = True, expires_in: float = 60.0) -> None:
    text = _claim_text(token, held, expires_in)
    server.put(f"telemetry/{store}/.writer.lock.d/{token}.json", text.encode())


def _refused(store: Store, match: str) -> UsageError:
    """The error a run gets when it asks for the store's lease and may not have it."""
    with pytest.raises(UsageError, match=match) as refused, store.writer_lock():
        pass
    return refused.value


def test_a_writer_that_lost_its_lease_commits_nothing(server, tmp_path, fast_leases):

    from hybridtrace.schema import table_schema

    store = _bucket_store(server, "store")
    with store.writer_lock():
        # another run takes over (this one was paused past its lease, say)
        _put_claim(server, "store", "someone-else")
        with pytest.raises(UsageError, match="took over the store's lease"):
            store.write_batch("0" * 32, {}, table_schema("sources").arrow_schema().empty_table())
    assert store.committed_batches() == set()  # the commit record was never written


def test_a_missing_bucket_under_a_prefix_is_an_error(server, tmp_path):
    if server.scheme == "file":
        pytest.skip("folders have their own error")
    with pytest.raises(UsageError, match="no such bucket"):
        ingest([server.uri("no-such-bucket/logs/")], tmp_path / "s")


def _claims(server, store: str) -> list[str]:
    import pyarrow.fs as pafs

    from hybridtrace.store.objects import bucket

    where = bucket(server.uri(f"{store}/.writer.lock.d"))
    selector = pafs.FileSelector(where.path, allow_not_found=True)
    return [info.base_name for info in where.filesystem.get_file_info(selector)]


def test_a_claim_that_lands_while_we_settle_makes_us_step_aside(server, fast_leases, monkeypatch):
    """The race a single lock object loses: the other run checked before we wrote and wrote
    after we read back. With a claim each, the later one sees the earlier and steps aside."""


    store = _bucket_store(server, "settle")
    real_sleep, waits = time.sleep, []

    def racing_sleep(seconds: float) -> None:
        if not waits:  # the first wait is our settling one: another run claims meanwhile
            _put_claim(server, "settle", "racer", held=False)
        waits.append(seconds)
        real_sleep(min(seconds, 0.05))

    monkeypatch.setattr(leases.time, "sleep", racing_sleep)
    _refused(store, "another ingest is writing")
    assert len(waits) == 2  # settled, saw the racer, withdrew, backed off, and saw it still there
    assert _claims(server, "telemetry/settle") == ["racer.json"]  # our claim is withdrawn

    # a racer that wrote and then withdrew (it saw us too) leaves the way clear on our retry
    server.delete("telemetry/settle/.writer.lock.d/racer.json")
    waits.clear()

    def withdrawing_sleep(seconds: float) -> None:
        path = "telemetry/settle/.writer.lock.d/racer.json"
        if len(waits) == 0:
            _put_claim(server, "settle", "racer", held=False)
        elif len(waits) == 1:
            server.delete(path)
        waits.append(seconds)

    monkeypatch.setattr(leases.time, "sleep", withdrawing_sleep)
    with store.writer_lock():
        assert len(waits) == 3  # settle, back off, settle again
        assert len(_claims(server, "telemetry/settle")) == 1
    assert _claims(server, "telemetry/settle") == []  # released


def test_a_settling_claim_does_not_stop_the_holder(server, fast_leases):
    """A run that claims while we hold is still settling: it will see us and leave, so our
    commits go on; a held claim or an older version's lock object means we were replaced."""

    from hybridtrace.schema import table_schema

    store = _bucket_store(server, "holder")
    empty = table_schema("sources").arrow_schema().empty_table()
    with store.writer_lock():
        _put_claim(server, "holder", "newcomer", held=False)
        store.write_batch("1" * 32, {}, empty)
        server.put("telemetry/holder/.writer.lock", json.dumps({"token": "old", "expires": 1e12}).encode())
        with pytest.raises(UsageError, match="took over"):
            store.write_batch("2" * 32, {}, empty)
    assert store.committed_batches() == {"1" * 32}
    # the older version's lock object is honoured by the next run too
    _refused(store, "another ingest is writing")


def test_expired_claims_of_dead_runs_are_swept(server, fast_leases):

    store = _bucket_store(server, "swept")
    _put_claim(server, "swept", "dead", expires_in=-1)
    with store.writer_lock():
        assert len(_claims(server, "telemetry/swept")) == 1
        assert "dead.json" not in _claims(server, "telemetry/swept")


def test_a_claim_left_by_a_run_killed_while_deciding_expires_soon(server, fast_leases, monkeypatch):
    """A claim not yet held lives only as long as deciding may take (three settle times and
    some slack for a slow store), not a whole lease."""


    store = _bucket_store(server, "undecided")
    start = time.time()
    undecided = {"token": "killed", "started": start, "expires": start + 3 * 0.3, "held": False}
    server.put("telemetry/undecided/.writer.lock.d/killed.json", json.dumps(undecided).encode())
    while True:
        try:
            with store.writer_lock():
                break
        except UsageError as refused:
            assert "another ingest is writing" in str(refused) and time.time() - start < 5
    assert time.time() - start < 5 and _claims(server, "telemetry/undecided") == []  # swept, then released

    # our own claim, while deciding, says so and expires three settle times after it was made
    seen, real_sleep = [], time.sleep

    def look(seconds: float) -> None:
        for name in _claims(server, "telemetry/undecided"):
            with server.filesystem.open_input_file(f"telemetry/undecided/.writer.lock.d/{name}") as handle:
                seen.append(json.loads(handle.read()))
        real_sleep(seconds)

    with monkeypatch.context() as patched:
        patched.setattr(leases.time, "sleep", look)
        with store.writer_lock():
            pass
    assert len(seen) == 1 and seen[0]["held"] is False
    assert seen[0]["expires"] - seen[0]["started"] == pytest.approx(0.9 + leases.UNDECIDED_SLACK_S)


def test_a_claim_that_cannot_be_read_is_not_taken_as_gone(server, fast_leases, monkeypatch):


    store = _bucket_store(server, "unreadable")
    _put_claim(server, "unreadable", "holder")
    real_read = roots.BucketRoot.read_text

    def flaky(self, rel: str) -> str:
        if rel.endswith("holder.json"):
            raise UsageError("cannot read it: 503 Slow Down")
        return real_read(self, rel)

    monkeypatch.setattr(roots.BucketRoot, "read_text", flaky)
    _refused(store, "503")
    assert _claims(server, "telemetry/unreadable") == ["holder.json"]


def test_an_error_while_claiming_leaves_no_claim(server, fast_leases, monkeypatch):

    store = _bucket_store(server, "broken")
    real_list, calls = roots.BucketRoot.list_files, []

    def failing_second_listing(self, rel: str, pattern: str = "part-*.parquet") -> list[str]:
        if rel.endswith(".d"):
            calls.append(rel)
            if len(calls) == 2:  # after our claim is written
                raise UsageError("cannot list the store: connection reset")
        return real_list(self, rel, pattern)

    monkeypatch.setattr(roots.BucketRoot, "list_files", failing_second_listing)
    _refused(store, "connection reset")
    monkeypatch.setattr(roots.BucketRoot, "list_files", real_list)
    assert _claims(server, "telemetry/broken") == []
    with store.writer_lock():  # nothing blocks the next run
        pass


def test_a_lease_must_last(server, tmp_path):
    store = _bucket_store(server, "zero")
    for bad in (-1, 0.5, float("inf")):  # 0.5 s is shorter than three settle times (0.9 s)
        with pytest.raises(UsageError, match="at least three settle times"), store.writer_lock(lease_s=bad):
            pass


def test_a_store_too_slow_to_decide_on_is_an_error_not_a_busy_store(server, fast_leases, monkeypatch):

    store = _bucket_store(server, "slow")
    real_sleep = time.sleep
    monkeypatch.setattr(leases, "UNDECIDED_SLACK_S", 0.0)
    with monkeypatch.context() as patched:
        patched.setattr(leases.time, "sleep", lambda seconds: real_sleep(seconds + 0.7))  # a stall
        slow = _refused(store, "answered too slowly")
    assert not isinstance(slow, leases.LeaseHeld)
    assert _claims(server, "telemetry/slow") == []


def test_of_two_held_claims_both_give_way(server, fast_leases, monkeypatch):
    """A run that took our undecided claim for dead (a stall, a skewed clock) may hold too."""


    store = _bucket_store(server, "rival")
    real_write = roots.BucketRoot.write_text

    def rival_meanwhile(self, rel: str, text: str) -> None:
        real_write(self, rel, text)
        if ".writer.lock.d/" in rel and json.loads(text)["held"] and not rel.endswith("rival.json"):
            real_write(self, ".writer.lock.d/rival.json", _claim_text("rival"))

    monkeypatch.setattr(roots.BucketRoot, "write_text", rival_meanwhile)
    _refused(store, "another ingest is writing")
    assert _claims(server, "telemetry/rival") == ["rival.json"]


def test_a_renewal_that_lands_late_gives_the_lease_up(server, fast_leases, monkeypatch):

    store = _bucket_store(server, "late")
    real_write, slow = roots.BucketRoot.write_text, []

    def stalling(self, rel: str, text: str) -> None:
        if slow and ".writer.lock.d/" in rel:
            time.sleep(1.2)  # longer than the whole 1 s lease
        real_write(self, rel, text)

    monkeypatch.setattr(roots.BucketRoot, "write_text", stalling)
    with store.writer_lock(lease_s=1.0):
        slow.append(True)
        deadline = time.time() + 10
        while _claims(server, "telemetry/late") and time.time() < deadline:
            time.sleep(0.1)
        assert _claims(server, "telemetry/late") == []  # given up: nobody waits for it
        with pytest.raises(UsageError, match="lost the store's lease"):
            store._lease_check()


def test_recovery_deletes_nothing_once_the_lease_is_lost(server, fast_leases):

    import pyarrow.fs as pafs

    store = _bucket_store(server, "recover")
    orphan = "telemetry/recover/transfers/part-" + "9" * 32 + "-0.parquet"
    with store.writer_lock():
        server.put(orphan, b"an interrupted batch's file")
        _put_claim(server, "recover", "rival")
        with pytest.raises(UsageError, match="took over"):
            store.recover()
    assert server.filesystem.get_file_info(orphan).type == pafs.FileType.File


def test_a_damaged_claim_is_swept_not_fatal(server, fast_leases):
    store = _bucket_store(server, "damaged")
    server.put("telemetry/damaged/.writer.lock.d/garbage.json", b"\xff\xfe\x00 not json")
    with store.writer_lock():
        assert "garbage.json" not in _claims(server, "telemetry/damaged")
