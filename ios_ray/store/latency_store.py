"""The latency store: one DuckDB file of stage latencies keyed by (stage_key, device_fingerprint, batch, dtype), and
of the schedules timed whole on each device (``runs``, from which a search fits its correction of stage costs).

Concurrency design. DuckDB lets one process open a file read-write, and a read-only open fails while
another process has it read-write. So no process keeps the file open: every operation is short and runs
under an advisory lock (`fcntl.flock`) on the sidecar file `<store>.lock`:

- a write (`put`, `import_`) takes the lock exclusively, ATTACHes the file read-write to a private
  in-memory DuckDB connection, writes the whole Arrow batch in one transaction, commits, DETACHes (which
  checkpoints and releases DuckDB's own file lock) and releases the lock. `put` first tries a plain
  INSERT (a search only writes keys it found missing); if a key already exists the primary key rejects
  it, that transaction rolls back, and the batch is written again as `INSERT ... ON CONFLICT DO UPDATE`;
- a read (`lookup`, `missing`, `query`, `stats`, `export`) takes the lock shared and ATTACHes the file
  READ_ONLY, so readers run side by side and see the store as of the last committed batch.

Several searches can therefore write to one store at once (their batches interleave) and `store query` or
`store stats` answer while they do. The in-memory connection lives as long as the LatencyStore: ATTACH,
format check and DETACH cost about 1 ms, a fresh `duckdb.connect` about 13 ms. A put of 1,000 rows costs
about 12 ms in all, mostly the commit and the checkpoint (bench/store_speed.py), which is nothing next to
measuring 1,000 stages. Checkpointing at every DETACH keeps the `.duckdb` file complete on its own
between calls, so copying it never leaves measurements behind in a write-ahead log. A writer killed with
SIGKILL loses at most the batch in flight: committed batches are in the file or in its write-ahead log,
which the next open replays, and the kernel drops the dead process's flock. The one part of a checkpoint
that a kill could tear, DuckDB's in-place rewrite of its metadata block, is undone from a journal saved
before it (`<store>.undo`, :mod:`ios_ray.store.undo`; about 2 ms a write). The lock needs a POSIX
system and a local file system (flock is not reliable over NFS).

Ctrl-C. DuckDB polls for Python signals while it works and turns a Ctrl-C into whichever error the call
was making (``Query interrupted``, a rollback without a transaction, an unreadable Arrow table), and the
batch in flight is lost. So in the main thread every operation holds Ctrl-C until it has committed and
detached, a few milliseconds, and then raises it as ``KeyboardInterrupt`` (:func:`ios_ray.interrupts.ctrl_c_held`):
a search stopped with Ctrl-C has stored every batch it handed to the store.

A new store is built in a temporary file next to the target and renamed into place, so a half-created store
never exists. An existing file is checked through a read-only ATTACH before anything writes to it, so a
file that is corrupt, not a store, or of another format version is rejected byte-for-byte untouched.

Paths. The path is resolved once, when the store is opened (symlinks followed): the lock sits beside the real
file, so a store reached through a symlink and through its real path takes one lock. Messages name the path as
the caller spelled it. A file with several hard-linked names is refused in one sentence: the lock and DuckDB's
write-ahead log would each sit beside the name that opened it, so two names would write side by side.

Failures of the file or the disk. DuckDB reports a file it cannot read in full (truncated, overwritten) or a
disk it cannot write (full, over a size limit) as an error of whichever call met it; every operation turns
those into one sentence (UserError, DuckDB's error as its cause). A write that fails rolls back: DuckDB writes
a batch to the write-ahead log first and into the file only at the checkpoint after the commit, so a failed
write leaves the committed batches as they were, and the next open replays a log cut short up to its last whole
commit.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import glob
import numbers
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from ios_ray.errors import StoreUnusable, UserError
from ios_ray.interrupts import ctrl_c_held
from ios_ray.store import DEFAULT_STORE_PATH, undo
from ios_ray.store.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    KEY_COLUMNS,
    RUN_SCHEMA,
    STORE_SCHEMA,
    conform,
    create_statements,
    quote,
    runs_statement,
)
from ios_ray.vocabulary import DEFAULT_DTYPE

_CATALOG = "store"
_COLUMNS = ", ".join(quote(name) for name in STORE_SCHEMA.names)
_UPDATES = ", ".join(f"{quote(n)} = excluded.{quote(n)}" for n in STORE_SCHEMA.names if n not in KEY_COLUMNS)
_INSERT = f"INSERT INTO {_CATALOG}.latency AS old ({_COLUMNS}) SELECT {_COLUMNS} FROM incoming"
_UPSERT = f"{_INSERT} ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET {_UPDATES}"
_UPSERT_NEWER = f"{_UPSERT} WHERE excluded.measured_at > old.measured_at"
_EXPORT_FIX = "pass a folder written by `ios-ray store export`"
#: Out of reach, so that the checkpoint at DETACH is a write's only one (the contract of :mod:`ios_ray.store.undo`).
_NO_AUTOMATIC_CHECKPOINT = "1000 TB"
#: DuckDB errors where the file could not be read in full or the disk could not be written: one sentence each.
_FILE_ERRORS = (duckdb.IOException, duckdb.FatalException, duckdb.TransactionException, duckdb.InternalException,
                duckdb.SerializationException)
_ERRNO = re.compile(r'"errno"\s*:\s*"?(\d+)')
_WRITE_FAILED = re.compile(r"could not (write|truncate|fsync|sync|create|extend)|no space left|file too large|"
                           r"disk quota", re.IGNORECASE)
_T = TypeVar("_T")


class LatencyStore:
    """A latency store file; every method opens it briefly under a lock, so many processes can share it."""

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_STORE_PATH, create: bool = True) -> None:
        """Open the store at `path`, creating it (and its folders) when missing and `create` is true."""
        self.path = Path(path)
        self._file = self.path.resolve()
        self._lock_path = self._file.with_name(self._file.name + ".lock")
        self._journal = self._file.with_name(self._file.name + ".undo")
        self._mutex = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        if self.path.is_dir():
            raise StoreUnusable(f"{self.path} is a folder, not a latency store file; pass a file path as the store.")
        if create and not self._file.exists():
            self._write(lambda con: None)
        else:
            self._read(lambda con: None)

    def put(self, rows: pa.Table) -> int:
        """Upsert a batch of rows (store schema) in one committed transaction; return the rows written."""
        table = conform(rows)
        if table.num_rows:
            try:
                self._write(lambda con: _sql(con, _INSERT), incoming=table)
            except duckdb.ConstraintException:
                self._write(lambda con: _sql(con, _UPSERT), incoming=table)
        return int(table.num_rows)

    def put_runs(self, rows: Sequence[Mapping[str, object]]) -> int:
        """Add schedules timed whole (:data:`~ios_ray.store.schema.RUN_SCHEMA`'s columns, ``measured_at`` now where
        absent) in one committed transaction; return the rows written."""
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        try:
            table = pa.Table.from_pylist([{"measured_at": now, **row} for row in rows], schema=RUN_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise UserError(f"schedule runs must have the columns {', '.join(RUN_SCHEMA.names)} ({err}).") from None
        if table.num_rows:
            insert = f"INSERT INTO {_CATALOG}.runs SELECT * FROM incoming"
            self._write(lambda con: (_sql(con, runs_statement(_CATALOG)), _sql(con, insert)), incoming=table)
        return int(table.num_rows)

    def runs(self, device_fingerprint: str, batch: int, dtype: str = DEFAULT_DTYPE) -> pa.Table:
        """The schedules timed whole on exactly this fingerprint, batch and dtype (none in a store made before
        runs were kept)."""
        sql = (f"SELECT * FROM {_CATALOG}.runs WHERE device_fingerprint = ? AND batch = ? AND dtype = ? "
               "ORDER BY measured_at")
        params = [device_fingerprint, _checked_batch(batch), dtype]

        def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
            try:
                return con.sql(sql, params=params).to_arrow_table()
            except duckdb.CatalogException:
                return RUN_SCHEMA.empty_table()

        return self._read(run)

    def lookup(
        self, stage_keys: Sequence[str], device_fingerprint: str, batch: int, dtype: str = DEFAULT_DTYPE
    ) -> dict[str, float]:
        """Return stage_key -> median_ms for the keys measured on exactly this fingerprint, batch and dtype."""
        found = self._rows_for(stage_keys, device_fingerprint, batch, dtype, "stage_key, median_ms")
        return dict(zip(found["stage_key"].to_pylist(), found["median_ms"].to_pylist()))

    def query(self, device: str | None = None, batch: int | None = None, model: str | None = None) -> pa.Table:
        """Return the rows matching every filter given (device label, batch, model), sorted."""
        filters = {"device": device, "batch": _checked_batch(batch) if batch is not None else None, "model": model}
        used = {name: value for name, value in filters.items() if value is not None}
        where = " AND ".join(f"{name} = ?" for name in used) or "TRUE"
        order = "device, batch, dtype, stage_key, device_fingerprint"
        sql = f"SELECT {_COLUMNS} FROM {_CATALOG}.latency WHERE {where} ORDER BY {order}"
        return self._read(lambda con: con.sql(sql, params=list(used.values())).to_arrow_table())

    def stats(self) -> pa.Table:
        """Return the row count per (device, batch, dtype, source)."""
        sql = f"SELECT device, batch, dtype, source, count(*) AS rows FROM {_CATALOG}.latency GROUP BY ALL ORDER BY ALL"
        return self._read(lambda con: con.sql(sql).to_arrow_table())

    @property
    def file_bytes(self) -> int:
        """Size of the store file in bytes."""
        return self._file.stat().st_size

    def export(self, directory: str | os.PathLike[str]) -> int:
        """Write every row as hive-partitioned Parquet: `directory`/device=<label>/batch=<n>/; return the row count."""
        target = Path(directory)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise UserError(f"{target} already exists and is not an empty folder; export into a new or empty folder.")
        copy = (
            f"COPY (SELECT {_COLUMNS} FROM {_CATALOG}.latency ORDER BY device, batch, stage_key) "
            f"TO {_sql_string(target)} (FORMAT parquet, PARTITION_BY (device, batch))"
        )

        def run(con: duckdb.DuckDBPyConnection) -> int:
            rows: int = _sql(con, f"SELECT count(*) FROM {_CATALOG}.latency")[0][0]
            if rows:
                try:
                    _sql(con, copy)
                except _FILE_ERRORS as err:
                    raise UserError(f"cannot write the export into {target} ({_reason(err)}); free space on its disk "
                                    "or export into another folder.") from err
            return rows

        return self._read(run)

    def import_(self, directory: str | os.PathLike[str]) -> int:
        """Merge the rows of an exported folder (newer measured_at wins); return the rows added (0 when re-imported)."""
        table = conform(_read_export(Path(directory)), f"the Parquet files under {directory}", _EXPORT_FIX)
        count = f"SELECT count(*) FROM {_CATALOG}.latency"

        def run(con: duckdb.DuckDBPyConnection) -> int:
            before: int = _sql(con, count)[0][0]
            _sql(con, _UPSERT_NEWER)
            after: int = _sql(con, count)[0][0]
            return after - before

        return self._write(run, incoming=table)

    def close(self) -> None:
        """Release the in-memory DuckDB connection (the store file is never held open between calls)."""
        with self._mutex:
            self._drop_connection()

    def _rows_for(self, stage_keys: Sequence[str], fingerprint: str, batch: int, dtype: str, columns: str) -> pa.Table:
        wanted = pa.table({"stage_key": pa.array(list(dict.fromkeys(stage_keys)), pa.string())})
        params = [fingerprint, _checked_batch(batch), dtype]
        sql = (
            f"SELECT {columns} FROM {_CATALOG}.latency WHERE device_fingerprint = ? AND batch = ? AND dtype = ? "
            "AND stage_key IN (SELECT stage_key FROM wanted)"
        )

        def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
            with _registered(con, "wanted", wanted):
                return con.sql(sql, params=params).to_arrow_table()

        return self._read(run)

    def _read(self, action: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        if not self._file.exists():
            raise StoreUnusable(f"no latency store at {self.path}; run a search first, or pass another store path.")
        with self._attached(write=False) as con:
            return action(con)

    def _write(self, action: Callable[[duckdb.DuckDBPyConnection], _T], incoming: pa.Table | None = None) -> _T:
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreUnusable(
                f"cannot create the folder {self.path.parent} ({err.strerror}); pass another store path."
            ) from None
        with self._attached(write=True) as con, _registered(con, "incoming", incoming):
            con.begin()
            try:
                result = action(con)
                con.commit()
            except BaseException:
                _rollback(con)
                raise
            return result

    @contextmanager
    def _attached(self, write: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        _refuse_hard_links(self.path, self._file)
        with ctrl_c_held(), self._mutex, _flock(self._lock_path, exclusive=write) as lock:
            if self._cut_short():
                fcntl.flock(lock, fcntl.LOCK_EX)  # a reader too: undoing a write cut short needs the file alone
                self._recover()
            con = self._connection()
            try:
                if write and not self._file.exists():
                    self._create(con)
                self._attach(con, self._file, read_only=not write)
            except _FILE_ERRORS as err:
                raise StoreUnusable(_failure(self.path, err)) from err
            try:
                _check_format(con, self.path)
                if write:
                    self._save_journal(con)
                yield con
            except _FILE_ERRORS as err:
                raise StoreUnusable(_failure(self.path, err)) from err
            finally:
                if self._detach(con) and write:  # detached: the checkpoint is whole, the journal not needed
                    undo.discard(self._journal)

    def _save_journal(self, con: duckdb.DuckDBPyConnection) -> None:
        """Save the before-image of what the checkpoint at DETACH may overwrite in place (:mod:`ios_ray.store.undo`)."""
        blocks = _sql(con, "SELECT block_id, block_size FROM pragma_metadata_info(?), pragma_database_size() "
                           "WHERE database_name = ?", [_CATALOG, _CATALOG])
        try:
            undo.save(self._file, self._journal, [undo.block_region(*block) for block in blocks])
        except OSError as err:
            reason = err.strerror or type(err).__name__
            if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise StoreUnusable(_write_failure(self.path, reason)) from None
            raise StoreUnusable(f"cannot write {self._journal}, the undo journal of {self.path} ({reason}); make "
                                f"{self._file.parent} writable or pass another store path.") from None

    def _cut_short(self) -> bool:
        """Whether a write to the store was cut short (its undo journal holds a before-image)."""
        try:
            return undo.pending(self._journal)
        except OSError as err:
            raise StoreUnusable(f"cannot read {self._journal}, the undo journal of {self.path} ({err.strerror}); "
                                "rerun with read access to it.") from None

    def _recover(self) -> None:
        """Undo a write that a killed process left cut short (its journal is beside the file)."""
        try:
            undo.recover(self._file, self._journal)
        except OSError as err:
            raise StoreUnusable(
                f"cannot undo the write to {self.path} that was cut short ({err.strerror}); rerun with write access "
                f"to {self._file} and {self._journal}."
            ) from None

    def _create(self, con: duckdb.DuckDBPyConnection) -> None:
        for stale in self._file.parent.glob(f".{glob.escape(self._file.name)}.*.new*"):
            stale.unlink()
        staging = self._file.with_name(f".{self._file.name}.{os.getpid()}.new")
        try:
            self._attach(con, staging, read_only=False)
            try:
                for statement in create_statements(_CATALOG):
                    _sql(con, statement)
            finally:
                self._detach(con)
            os.replace(staging, self._file)
        finally:
            staging.unlink(missing_ok=True)

    def _attach(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        mode = ", READ_ONLY" if read_only else ""
        try:
            _sql(con, f"ATTACH {_sql_string(path)} AS {_CATALOG} (TYPE duckdb{mode})")
        except duckdb.Error as err:
            raise StoreUnusable(_failure(self.path, err)) from err

    def _detach(self, con: duckdb.DuckDBPyConnection) -> bool:
        """DETACH the store (which checkpoints a write); False where that failed (the connection is dropped)."""
        try:
            _sql(con, f"DETACH {_CATALOG}")
        except duckdb.Error:
            self._drop_connection()
            return False
        return True

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._con = duckdb.connect(
                ":memory:", config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                    "checkpoint_threshold": _NO_AUTOMATIC_CHECKPOINT}
            )
        return self._con

    def _drop_connection(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def _refuse_hard_links(path: Path, file: Path) -> None:
    """UserError where the store file has other names (hard links): the lock sits beside the name a store is opened
    by, and so does the write-ahead log DuckDB leaves of a write cut short, so two names of one store would write
    side by side and could replay an old log over newer rows."""
    try:
        names = file.stat().st_nlink
    except OSError:
        return  # missing (it is created under the lock) or unreadable (the open says so)
    if names > 1:
        raise StoreUnusable(f"{path} is one of {names} hard-linked names of one file, and ios-ray locks a store, and "
                            "DuckDB logs its writes, beside the name it is opened by; give the store one name (remove "
                            "the other links, or copy the file) and point at it with symlinks, which share its lock.")


@contextmanager
def _flock(path: Path, exclusive: bool) -> Iterator[int]:
    """Hold an advisory lock on `path`; yield its descriptor (``flock`` on it converts the lock)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise StoreUnusable(
            f"cannot open the lock file {path} ({err.strerror}); make its folder writable or pass another store path."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table | None) -> Iterator[None]:
    if table is None:
        yield
        return
    con.register(name, table)
    try:
        yield
    finally:
        con.unregister(name)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, where DuckDB has not already ended it (a failed commit ends it)."""
    try:
        con.rollback()
    except duckdb.TransactionException:
        pass


def _check_format(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    try:
        meta = dict(_sql(con, f"SELECT key, value FROM {_CATALOG}.meta"))
    except (duckdb.CatalogException, duckdb.BinderException):
        meta = {}
    if meta.get("format") != FORMAT_NAME:
        raise StoreUnusable(f"{path} is a DuckDB file but not an ios-ray latency store; pass another store path.")
    if meta.get("version") != str(FORMAT_VERSION):
        raise StoreUnusable(
            f"{path} is a latency store of format version {meta.get('version')}, but this ios-ray reads version "
            f"{FORMAT_VERSION}; use a matching ios-ray or pass another store path."
        )


def _failure(path: Path, err: duckdb.Error) -> str:
    """One sentence for a store file that DuckDB could not open, read or write."""
    text = str(err)
    if "could not set lock" in text.lower():
        return f"{path} is open in another program (not ios-ray); close that program and retry."
    if _WRITE_FAILED.search(text):
        return _write_failure(path, _reason(err))
    return (
        f"{path} is not a readable latency store (not a DuckDB file, damaged or truncated, or from a newer "
        "DuckDB); move it away or pass another store path."
    )


def _write_failure(path: Path, reason: str) -> str:
    """One sentence for a write the disk refused."""
    return (f"cannot write the latency store {path} ({reason}); free space on its disk or pass another store path, "
            "then rerun: the rows it stored before are kept.")


def _reason(err: duckdb.Error) -> str:
    """What the system said of a failed write (``No space left on device``), from DuckDB's message: the text of the
    errno it carries, else its first line's last clause."""
    text = str(err)
    errno = _ERRNO.search(text)
    if errno:
        return os.strerror(int(errno.group(1)))
    return text.splitlines()[0].rpartition(": ")[2].strip() or type(err).__name__


def _read_export(directory: Path) -> pa.Table:
    if not directory.is_dir():
        raise UserError(f"{directory} is not a folder; {_EXPORT_FIX}.")
    if not any(directory.rglob("*.parquet")):
        raise UserError(f"{directory} holds no Parquet files; {_EXPORT_FIX}.")
    partitioning = ds.partitioning(STORE_SCHEMA.empty_table().select(["device", "batch"]).schema, flavor="hive")
    try:
        return ds.dataset(directory, format="parquet", partitioning=partitioning).to_table()
    except (pa.ArrowInvalid, OSError) as err:
        raise UserError(f"{directory} holds unreadable Parquet ({err}); {_EXPORT_FIX}.") from None


def _sql(con: duckdb.DuckDBPyConnection, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    return con.execute(statement, list(params)).fetchall()


def _sql_string(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _checked_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch <= 0:
        raise UserError(f"batch must be a positive integer, got {batch!r}.")
    return int(batch)
