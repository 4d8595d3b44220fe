"""The latency store: upserts, exact lookups, crash safety, concurrent processes, export/import, bad files."""

from __future__ import annotations

import hashlib
import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ios_ray.errors import UserError
from ios_ray.store import LatencyStore, rows_to_table, undo
from ios_ray.app.cli.store import store_app
from tests.store_writer import FINGERPRINT, fake_keys, fake_rows, missing
from tests.helpers import HANG_S, open_store

BAD_FILES = ("corrupt", "other_version", "not_a_store", "text")


@pytest.fixture()
def store_path(tmp_path: Path) -> Path:
    """Where a test's store lives (not created)."""
    return tmp_path / "ios_store" / "latency.duckdb"


def start_writer(
    path: Path, prefix: str, batches: int, batch_rows: int, pause: float = 0.0, *options: str
) -> subprocess.Popen[str]:
    """Start a writer process that prints `committed <n>` after each batch (``options``: its other flags)."""
    arguments = [str(path), prefix, str(batches), str(batch_rows), "--pause", str(pause), *options]
    command = [sys.executable, "-m", "tests.store_writer", *arguments]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> None:
    """Wait for a writer process and check it succeeded."""
    _, err = process.communicate(timeout=HANG_S)
    assert process.returncode == 0, err


def stored_keys(store: LatencyStore) -> list[str]:
    """Every stage key in the store, sorted, repeats kept."""
    return sorted(store.query()["stage_key"].to_pylist())


def sha256(path: Path) -> str:
    """Hash of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_bad_file(kind: str, path: Path) -> None:
    """Write a file at `path` that the store must reject."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "corrupt":
        path.write_bytes(random.Random(7).randbytes(64 * 1024))
    elif kind == "text":
        path.write_text("stage_key,median_ms\nabc,1.0\n")
    elif kind == "not_a_store":
        with duckdb.connect(str(path)) as con:
            con.execute("CREATE TABLE results (run INTEGER, loss DOUBLE)")
            con.execute("INSERT INTO results VALUES (1, 0.5)")
    else:  # other_version
        open_store(path).put(fake_rows(["k"]))
        with duckdb.connect(str(path)) as con:
            con.execute("UPDATE meta SET value = '2' WHERE key = 'version'")


def test_put_upserts_one_row_per_key(store_path: Path) -> None:
    store = open_store(store_path)
    assert store.put(fake_rows(["a", "b"], median_ms=1.0)) == 2
    assert store.put(fake_rows(["a"], median_ms=2.0)) == 1
    rows = store.query()
    assert rows.num_rows == 2
    assert dict(zip(rows["stage_key"].to_pylist(), rows["median_ms"].to_pylist())) == {"a": 2.0, "b": 1.0}


def test_put_keeps_the_last_row_of_a_key_repeated_in_one_batch(store_path: Path) -> None:
    store = open_store(store_path)
    repeated = pa.concat_tables([fake_rows(["a", "b"], median_ms=1.0), fake_rows(["a"], median_ms=3.0)])
    assert store.put(repeated) == 2
    assert store.lookup(["a", "b"], FINGERPRINT, 1) == {"a": 3.0, "b": 1.0}


def test_lookup_matches_fingerprint_batch_and_dtype_exactly(store_path: Path) -> None:
    store = open_store(store_path)
    store.put(fake_rows(["a", "b"], median_ms=1.0))
    store.put(fake_rows(["a"], median_ms=5.0, fingerprint="another"))
    store.put(fake_rows(["b"], median_ms=7.0, batch=8))
    assert store.lookup(["a", "b", "c"], FINGERPRINT, 1) == {"a": 1.0, "b": 1.0}
    assert store.lookup(["a", "b"], "another", 1) == {"a": 5.0}
    assert store.lookup(["a", "b"], FINGERPRINT, 8) == {"b": 7.0}
    assert store.lookup(["a"], FINGERPRINT, 1, dtype="float16") == {}
    assert missing(store, ["c", "a", "c", "b"], "another", 1) == ["c", "b"]


def test_query_filters_by_device_batch_and_model(store_path: Path) -> None:
    store = open_store(store_path)
    store.put(fake_rows(["a", "b"]))
    store.put(fake_rows(["a"], batch=8))
    store.put(fake_rows(["s"], device="sim:v100", fingerprint="sim"))
    assert store.query(device="cpu").num_rows == 3
    assert store.query(device="cpu", batch=8)["stage_key"].to_pylist() == ["a"]
    assert store.query(device="sim:v100", model="toy")["source"].to_pylist() == ["simulated"]
    assert store.query(model="other").num_rows == 0
    assert store.stats().to_pylist() == [
        {"device": "cpu", "batch": 1, "dtype": "float32", "source": "measured", "rows": 2},
        {"device": "cpu", "batch": 8, "dtype": "float32", "source": "measured", "rows": 1},
        {"device": "sim:v100", "batch": 1, "dtype": "float32", "source": "simulated", "rows": 1},
    ]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("source", "guessed"),
        ("strategy", "parallel"),
        ("batch", 0),
        ("median_ms", float("nan")),
        ("device", "sim:v100"),
    ],
)
def test_put_rejects_bad_rows_and_writes_nothing(store_path: Path, column: str, value: object) -> None:
    store = open_store(store_path)
    rows = fake_rows(["a"])
    rows = rows.set_column(
        rows.schema.get_field_index(column), column, pc.cast([value], rows.schema.field(column).type)
    )
    with pytest.raises(UserError, match=column):
        store.put(rows)
    assert store.query().num_rows == 0


def test_put_rejects_a_table_without_the_store_columns(store_path: Path) -> None:
    with pytest.raises(UserError, match="missing: model"):
        open_store(store_path).put(fake_rows(["a"]).drop_columns(["model"]))


def test_a_killed_writer_loses_at_most_the_batch_in_flight_and_a_rerun_fills_the_rest(store_path: Path) -> None:
    batches, batch_rows = 100, 200
    writer = start_writer(store_path, "k", batches, batch_rows)
    for _ in range(3):
        assert writer.stdout.readline().startswith("committed")
    writer.send_signal(signal.SIGKILL)
    writer.communicate(timeout=HANG_S)
    keys = fake_keys("k", batches * batch_rows)
    store = open_store(store_path)
    survived = stored_keys(store)
    assert 3 * batch_rows <= len(survived) < len(keys)
    assert survived == keys[: len(survived)] and len(survived) % batch_rows == 0
    todo = missing(store, keys, FINGERPRINT, 1)
    assert len(todo) == len(keys) - len(survived)
    store.put(fake_rows(todo))
    assert stored_keys(store) == keys


@pytest.mark.slow
def test_ctrl_c_during_writes_stops_with_keyboard_interrupt_and_keeps_every_batch_handed_over(tmp_path: Path) -> None:
    # DuckDB turns a Ctrl-C inside a call into whatever error that call was making ("Query interrupted", a
    # rollback without a transaction...) and the batch is lost; the store holds Ctrl-C until the batch committed
    batch_rows, stopped = 2000, 0
    for attempt in range(12):
        path = tmp_path / f"store{attempt}.duckdb"
        writer = start_writer(path, "k", 16, batch_rows)
        for _ in range(2):
            assert writer.stdout.readline().startswith("committed")
        time.sleep(0.003 * (attempt % 6))  # Ctrl-C at another point of a put each time
        writer.send_signal(signal.SIGINT)
        out, err = writer.communicate(timeout=HANG_S)
        if writer.returncode == 0:
            continue  # a loaded machine let it finish first
        stopped += 1
        assert err.strip().splitlines()[-1] == "KeyboardInterrupt", err
        returned = 2 + out.count("committed")  # puts that returned; one more may have committed as Ctrl-C came
        assert len(stored_keys(open_store(path))) in (returned * batch_rows, (returned + 1) * batch_rows)
        if stopped == 6:
            break
    assert stopped == 6


def test_concurrent_writer_processes_all_complete_with_all_rows(store_path: Path) -> None:
    # the second "a" writer rewrites the first one's keys while both run: upserts, never duplicates
    writers = [start_writer(store_path, prefix, 30, 200) for prefix in ("a", "b", "a")]
    for writer in writers:
        finish(writer)
    assert stored_keys(open_store(store_path)) == fake_keys("a", 6000) + fake_keys("b", 6000)


def test_cli_reads_while_a_writer_process_is_writing(store_path: Path) -> None:
    writer = start_writer(store_path, "w", 60, 200, pause=0.02)
    assert writer.stdout.readline().startswith("committed")
    runner, seen = CliRunner(), [0]
    for _ in range(5):
        stats = runner.invoke(store_app, ["stats", "--store", str(store_path)])
        query = runner.invoke(store_app, ["query", "--device", "cpu", "--format", "csv", "--store", str(store_path)])
        assert stats.exit_code == 0 and query.exit_code == 0, stats.output + query.output
        seen.append(len(query.stdout.splitlines()) - 1)
    assert writer.poll() is None, "the writer finished before the reads; make it write longer"
    assert seen == sorted(seen) and seen[-1] >= 200
    finish(writer)
    assert len(stored_keys(open_store(store_path))) == 60 * 200


def test_export_then_import_round_trips_and_a_second_import_adds_nothing(store_path: Path, tmp_path: Path) -> None:
    store = open_store(store_path)
    store.put(fake_rows(fake_keys("x", 50)))
    store.put(fake_rows(fake_keys("x", 20), batch=8))
    store.put(fake_rows(fake_keys("s", 30), device="sim:v100", fingerprint="sim"))
    export = tmp_path / "export"
    assert store.export(export) == 100
    assert {path.name for path in export.iterdir()} == {"device=cpu", "device=sim%3Av100"}
    copy = tmp_path / "copy.duckdb"
    runner = CliRunner()
    first = runner.invoke(store_app, ["import", str(export), "--store", str(copy)])
    second = runner.invoke(store_app, ["import", str(export), "--store", str(copy)])
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert "imported 100 new rows" in first.stdout and "imported 0 new rows" in second.stdout
    assert open_store(copy).query().equals(store.query())


def test_import_keeps_the_newer_measurement(store_path: Path, tmp_path: Path) -> None:
    old = open_store(tmp_path / "old.duckdb")
    old.put(fake_rows(["a"], median_ms=1.0))
    old.export(tmp_path / "old_export")
    store = open_store(store_path)
    store.put(fake_rows(["a"], median_ms=2.0))
    assert store.import_(tmp_path / "old_export") == 0
    assert store.lookup(["a"], FINGERPRINT, 1) == {"a": 2.0}


def test_import_rejects_a_folder_that_is_not_an_export(store_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "other" / "device=cpu" / "batch=1"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"stage_key": ["a"], "median_ms": [1.0]}), folder / "part.parquet")
    store = open_store(store_path)
    with pytest.raises(UserError, match="missing: device_fingerprint"):
        store.import_(tmp_path / "other")
    assert store.query().num_rows == 0


def test_rows_to_table_names_a_missing_or_unknown_field() -> None:
    row = fake_rows(["a"]).to_pylist()[0]
    with pytest.raises(UserError, match="lacks the field 'host'"):
        rows_to_table([{name: value for name, value in row.items() if name != "host"}])
    with pytest.raises(UserError, match="unknown field"):
        rows_to_table([{**row, "gpu": "v100"}])


def test_export_refuses_a_folder_that_holds_files(store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not an empty folder"):
        open_store(store_path).export(tmp_path / "full")


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_store_file_is_rejected_and_left_untouched(store_path: Path, tmp_path: Path, kind: str) -> None:
    make_bad_file(kind, store_path)
    before = sha256(store_path)
    with pytest.raises(UserError, match=re.escape(str(store_path))):
        open_store(store_path, create=False)
    with pytest.raises(UserError, match=re.escape(str(store_path))):
        open_store(store_path, create=True)
    open_store(tmp_path / "good.duckdb").export(tmp_path / "export")
    runner = CliRunner()
    for args in (
        ["stats"],
        ["query", "--device", "cpu"],
        ["export", str(tmp_path / "out")],
        ["import", str(tmp_path / "export")],
    ):
        result = runner.invoke(store_app, [*args, "--store", str(store_path)])
        assert result.exit_code == 1
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        assert str(store_path) in result.stderr and "Traceback" not in result.stderr
    assert sha256(store_path) == before
    assert not store_path.with_name(store_path.name + ".wal").exists()


def test_other_version_says_which_version(store_path: Path) -> None:
    make_bad_file("other_version", store_path)
    with pytest.raises(UserError, match="format version 2"):
        open_store(store_path)


def test_reading_a_missing_store_says_how_to_make_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "latency.duckdb"
    with pytest.raises(UserError, match="no latency store at .*run a search first"):
        open_store(path, create=False)
    result = CliRunner().invoke(store_app, ["stats", "--store", str(path)])
    assert result.exit_code == 1 and "no latency store at" in result.stderr
    assert not path.parent.exists()


def test_writing_creates_the_store_and_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "latency.duckdb"
    store = open_store(path)
    assert store.put(fake_rows(["a"])) == 1
    store.close()
    assert store.lookup(["a"], FINGERPRINT, 1) == {"a": 1.0}
    assert open_store(path, create=False).lookup(["a"], FINGERPRINT, 1) == {"a": 1.0}


def test_query_json_has_every_column(store_path: Path) -> None:
    open_store(store_path).put(fake_rows(["a"]))
    result = CliRunner().invoke(store_app, ["query", "--device", "cpu", "--format", "json", "--store", str(store_path)])
    (row,) = json.loads(result.stdout)
    assert row["stage_key"] == "a" and row["source"] == "measured" and json.loads(row["stage"])["units"] == ["a"]


def test_writers_through_a_symlink_and_the_real_path_share_one_lock(tmp_path: Path) -> None:
    real = tmp_path / "real.duckdb"
    link = tmp_path / "link.duckdb"
    link.symlink_to(real)
    open_store(real)
    writers = [start_writer(path, prefix, 30, 200) for path, prefix in ((real, "a"), (link, "b"), (link, "c"))]
    for writer in writers:
        finish(writer)
    assert stored_keys(open_store(link)) == fake_keys("a", 6000) + fake_keys("b", 6000) + fake_keys("c", 6000)


@pytest.mark.slow
def test_kill_9_during_concurrent_writes_through_two_spellings_loses_no_committed_row(tmp_path: Path) -> None:
    """20 rounds: two writers on one store, one through a symlink, each killed with SIGKILL at a random moment."""
    real = tmp_path / "real.duckdb"
    link = tmp_path / "link.duckdb"
    link.symlink_to(real)
    chance, batches, batch_rows, rounds = random.Random(36), 100, 50, 20
    spellings = {"a": real, "b": link}

    def start_round(number: int) -> dict[str, subprocess.Popen[str]]:
        return {name: start_writer(path, f"r{number:02d}{name}", batches, batch_rows, 0.0, "--wait")
                for name, path in spellings.items()}

    expected: list[str] = []
    ahead = [start_round(number) for number in range(2)]  # later rounds' writers start while one runs: imports are slow
    for number in range(rounds):
        writers = ahead.pop(0)
        if number + 2 < rounds:
            ahead.append(start_round(number + 2))
        for writer in writers.values():
            assert writer.stdout.readline() == "ready\n"
        for writer in writers.values():
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for _, writer in sorted(writers.items(), key=lambda item: chance.random()):
            time.sleep(chance.uniform(0.0, 0.4))
            writer.send_signal(signal.SIGKILL)
        stored = set(stored_keys(open_store(link, create=False))) if real.exists() else set()  # readable
        for name, writer in writers.items():
            out, err = writer.communicate(timeout=HANG_S)
            assert writer.returncode == -signal.SIGKILL, err  # killed by us, not stopped by an error
            committed = out.count("committed")
            keys = fake_keys(f"r{number:02d}{name}", batches * batch_rows)
            have = [key for key in keys if key in stored]
            assert have == keys[: len(have)], "rows of a writer are stored batch by batch, in order"
            assert committed * batch_rows <= len(have) <= (committed + 1) * batch_rows  # at most the batch in flight
            expected += have
    assert len(expected) >= rounds * batch_rows  # the kills came while batches were being written
    assert stored_keys(open_store(real, create=False)) == sorted(expected)


#: DuckDB's block (the default size) and the page the kernel copies at a time, between which a SIGKILL stops a write.
DUCKDB_BLOCK, PAGE = 256 * 1024, 4096
_DIE_BEFORE_CHECKPOINT = """
import os, sys
from ios_ray.store import LatencyStore
from tests.store_writer import fake_keys, fake_rows
store = LatencyStore(sys.argv[1], create=False)
LatencyStore._detach = lambda self, con: os._exit(9)  # committed, journal saved, killed before the checkpoint
store.put(fake_rows(fake_keys("cut", 300)))
"""


def cut_short_write(store_path: Path) -> tuple[bytes, bytes]:
    """Leave the store as a SIGKILL inside the checkpoint of a 300-row put ("cut-*" keys) does: the writer committed
    (the batch is in DuckDB's write-ahead log) and saved its undo journal, and the kernel stopped the checkpoint's
    write of each block it changed after that block's first page. Return the file before and after the whole
    checkpoint."""
    wal = store_path.with_name(store_path.name + ".wal")
    before = store_path.read_bytes()
    died = subprocess.run([sys.executable, "-c", _DIE_BEFORE_CHECKPOINT, str(store_path)], capture_output=True,
                          timeout=HANG_S)
    assert died.returncode == 9, died.stderr
    assert store_path.read_bytes() == before and wal.exists()
    finished = store_path.with_name("finished.duckdb")
    finished.write_bytes(before)
    finished.with_name(finished.name + ".wal").write_bytes(wal.read_bytes())
    con = duckdb.connect()
    con.execute(f"ATTACH '{finished}' AS finished")
    con.execute("DETACH finished")  # the checkpoint the writer did not live to make
    after = finished.read_bytes()
    torn = bytearray(before)
    for start in range(undo.HEADER_BYTES, min(len(before), len(after)), DUCKDB_BLOCK):
        if before[start : start + DUCKDB_BLOCK] != after[start : start + DUCKDB_BLOCK]:
            torn[start : start + PAGE] = after[start : start + PAGE]
    store_path.write_bytes(bytes(torn))
    return before, after


def test_a_write_killed_inside_its_checkpoint_is_undone_and_its_committed_batch_kept(store_path: Path) -> None:
    """DuckDB rewrites its metadata block in place at every checkpoint; a kill during that write left a block whose
    checksum failed, and the whole store unreadable (CI, 2026-11-28). The undo journal puts the block back."""
    store = open_store(store_path)
    for number in range(5):
        store.put(fake_rows(fake_keys(f"k{number}", 200)))
    journal = store_path.with_name(store_path.name + ".undo")
    cut_short_write(store_path)
    assert undo.pending(journal)
    unjournaled = store_path.with_name("unjournaled.duckdb")
    unjournaled.write_bytes(store_path.read_bytes())
    unjournaled.with_name("unjournaled.duckdb.wal").write_bytes(store_path.with_name(store_path.name + ".wal").read_bytes())
    with pytest.raises(UserError, match="not a readable latency store"):
        open_store(unjournaled, create=False)  # the tear is one that matters
    expected = sorted(fake_keys("cut", 300) + [key for n in range(5) for key in fake_keys(f"k{n}", 200)])
    assert stored_keys(open_store(store_path, create=False)) == expected  # a reader undoes it
    assert not undo.pending(journal)
    open_store(store_path).put(fake_rows(["after"]))
    assert stored_keys(open_store(store_path)) == sorted(expected + ["after"])


def test_a_journal_left_after_a_finished_checkpoint_is_dropped_and_nothing_put_back(store_path: Path) -> None:
    store = open_store(store_path)
    store.put(fake_rows(fake_keys("k", 200)))
    _, after = cut_short_write(store_path)
    store_path.write_bytes(after)  # the checkpoint finished; the kill came before the journal was marked empty
    store_path.with_name(store_path.name + ".wal").unlink()
    assert stored_keys(open_store(store_path, create=False)) == sorted(fake_keys("k", 200) + fake_keys("cut", 300))
    assert store_path.read_bytes() == after and not undo.pending(store_path.with_name(store_path.name + ".undo"))


@pytest.mark.parametrize("kept", (0.0, 0.5, 0.999))
def test_a_journal_cut_short_while_saved_is_dropped_and_nothing_put_back(store_path: Path, kept: float) -> None:
    """A kill while the journal was being written came before the checkpoint began: the file is whole as it is."""
    store = open_store(store_path)
    store.put(fake_rows(fake_keys("k", 200)))
    journal = store_path.with_name(store_path.name + ".undo")
    before = store_path.read_bytes()
    undo.save(store_path, journal, [undo.block_region(0, DUCKDB_BLOCK)])  # the journal of a write about to begin
    whole = journal.read_bytes()
    start = undo.HEADER_BYTES
    store_path.write_bytes(before[:start] + bytes(PAGE) + before[start + PAGE :])  # what putting back would undo
    torn = store_path.read_bytes()
    journal.write_bytes(whole[: int(len(whole) * kept)])
    with pytest.raises(UserError, match="not a readable latency store"):
        open_store(store_path, create=False)  # nothing was put back over the (here deliberately) damaged block
    assert store_path.read_bytes() == torn and not undo.pending(journal)


@pytest.mark.parametrize("kept", (0.05, 0.2, 0.35))
def test_a_truncated_store_gives_one_sentence_and_stays_byte_identical(store_path: Path, tmp_path: Path,
                                                                        kept: float) -> None:
    store = open_store(store_path)
    for number in range(5):
        store.put(fake_rows(fake_keys(f"k{number}", 2000)))
    size = store.file_bytes
    good = open_store(tmp_path / "good.duckdb")
    good.put(fake_rows(["other"]))
    good.export(tmp_path / "export")
    with store_path.open("r+b") as file:
        file.truncate(int(size * kept))
    before = sha256(store_path)
    with pytest.raises(UserError, match="not a readable latency store .*damaged or truncated"):
        open_store(store_path).put(fake_rows(["new"]))
    runner = CliRunner()
    for args in (["stats"], ["query", "--device", "cpu"], ["import", str(tmp_path / "export")]):
        result = runner.invoke(store_app, [*args, "--store", str(store_path)])
        assert result.exit_code == 1, result.output
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        assert "not a readable latency store" in result.stderr and "Traceback" not in result.stderr
    assert sha256(store_path) == before


def test_a_full_disk_stops_the_write_in_one_sentence_and_keeps_every_committed_row(store_path: Path) -> None:
    # RLIMIT_FSIZE makes writes past the size fail as a full disk does (EFBIG instead of ENOSPC)
    writer = start_writer(store_path, "k", 100, 500, 0.0, "--max-file-bytes", "1500000")
    out, err = writer.communicate(timeout=HANG_S)
    assert writer.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot write the latency store {store_path} (File too large); free space")
    committed = out.count("committed")
    assert 0 < committed < 100
    store = open_store(store_path)
    assert stored_keys(store) == fake_keys("k", committed * 500)
    store.put(fake_rows(["after"]))
    assert len(stored_keys(store)) == committed * 500 + 1


def test_an_export_onto_a_full_disk_says_so_of_the_export_in_one_sentence(store_path: Path, tmp_path: Path) -> None:
    open_store(store_path).put(fake_rows(fake_keys("k", 5000)))
    before = sha256(store_path)
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))\n"
              "from ios_ray.app.cli import app\n"
              "app(sys.argv[1:])\n")
    out = tmp_path / "export"
    ran = subprocess.run([sys.executable, "-c", script, "store", "export", str(out), "--store", str(store_path)],
                         capture_output=True, text=True, timeout=HANG_S)
    assert ran.returncode == 1 and ran.stdout == "" and ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(f"error: cannot write the export into {out} (File too large); free space")
    assert sha256(store_path) == before


def test_a_hard_linked_store_is_refused_in_one_true_sentence_and_left_untouched(tmp_path: Path) -> None:
    """Issue 46, item 14: two names of one file took two locks, and DuckDB's lock conflict was blamed on another
    program."""
    real, other = tmp_path / "real.duckdb", tmp_path / "other.duckdb"
    open_store(real).put(fake_rows(["k"]))
    other.hardlink_to(real)
    before = sha256(real)
    for path in (real, other):
        with pytest.raises(UserError, match=r"is one of 2 hard-linked names of one file.*give the store one name"):
            open_store(path).put(fake_rows(["j"]))
    result = CliRunner().invoke(store_app, ["stats", "--store", str(other)])
    assert result.exit_code == 1 and "hard-linked" in result.output and "another program" not in result.output
    assert sha256(real) == before
    other.unlink()
    assert stored_keys(open_store(real)) == ["k"]


def test_the_package_lists_every_name_it_loads_lazily_and_loads_each() -> None:
    import ios_ray.store as store

    assert set(store.__all__) == {"DEFAULT_STORE_PATH", *store._HOMES}
    assert all(getattr(store, name) is not None for name in store.__all__)
