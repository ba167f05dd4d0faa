"""Engine, sessions and migrations. One `Database` per process, built from settings."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, make_url, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from autorl.errors import ConfigurationError, ServiceUnavailableError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: How long a service waits at start-up for its database (one that starts after it is normal in
#: Kubernetes), and how often it says it still waits.
DATABASE_WAIT_S = 60.0
DATABASE_WAIT_REPORT_S = 15.0
#: SQLite's own words for a file that is no database of its (or a damaged one).
SQLITE_NOT_A_DATABASE = ("file is not a database", "database disk image is malformed")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # The grader and several worker processes share one SQLite file in local mode: WAL lets readers
    # outside a transaction proceed during a write and the busy timeout turns lock contention into
    # waiting, not errors.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
    # The driver's own transaction handling starts a transaction only at the first write, so a
    # count read before it is not protected (a limit check, then an insert). `_sqlite_begin` opens
    # every transaction itself instead.
    dbapi_conn.isolation_level = None


#: The execution option that marks a connection's transactions read-only (:meth:`Database.read_session`).
READ_ONLY = "autorl_read_only"


def _sqlite_begin(conn: Connection) -> None:
    # IMMEDIATE takes SQLite's write lock at BEGIN: transactions that may write run one at a time, so
    # a check and the write that depends on it (limits, claims, finishing) are atomic across
    # processes, and no transaction fails half-way because another wrote first. They are all short.
    # A read-only transaction takes no lock at BEGIN: in WAL mode it reads a snapshot while writers
    # go on, and `query_only` makes any write in it an error rather than a wait for the write lock.
    # Every transaction sets `query_only` for itself, so a pooled connection carries none over.
    read_only = bool(conn.get_execution_options().get(READ_ONLY))
    conn.exec_driver_sql(f"PRAGMA query_only={int(read_only)}")
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


#: Connections a process keeps to SQLite, and how many more it may open at a peak of concurrent
#: requests (closed again once returned). Each holds the database file and its log open.
SQLITE_POOL_SIZE = 5
SQLITE_POOL_OVERFLOW = 10


def _sqlite_file_pragmas(path: str) -> Any:
    """The pragmas of each new connection, with a file that is not a SQLite database (the first
    pragma reads its header) named, with the fix, rather than as SQLite's bare words."""

    def connect(dbapi_conn: Any, record: Any) -> None:
        try:
            _sqlite_pragmas(dbapi_conn, record)
        except sqlite3.DatabaseError as exc:
            if not str(exc).startswith(SQLITE_NOT_A_DATABASE):
                raise
            dbapi_conn.close()
            raise not_a_database(path, exc) from None

    return connect


def not_a_database(path: str, exc: BaseException) -> ConfigurationError:
    """The refusal of a SQLite file that is not a database (or a damaged one), with the fix."""
    return ConfigurationError(
        f"the database file {path} is not a SQLite database ({exc}): move it aside "
        f"(mv {path} {path}.bad; a new, empty one is made) or point AUTORL_DATABASE_URL at "
        "the platform's database"
    )


def shown_url(url: str) -> str:
    """A database URL as it may be printed: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL: nothing in it can be told apart
        return "(not a URL)"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = make_url(url).database or ""
        on_disk = path not in ("", ":memory:")
        if on_disk:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # A database in memory lives in its one connection (SQLAlchemy's single-connection pool).
        pool = {"pool_size": SQLITE_POOL_SIZE, "max_overflow": SQLITE_POOL_OVERFLOW} if on_disk else {}
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **pool)
        event.listen(engine, "connect", _sqlite_file_pragmas(path))
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args={"connect_timeout": 5}
    )


class Database:
    """The engine and a session factory. `session()` commits on success and rolls back on error."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Postgres: a READ ONLY transaction (the driver's read-only mode, reset when the connection
        # goes back to the pool); SQLite: a deferred, query-only one (`_sqlite_begin`).
        options = {READ_ONLY: True} if self.is_sqlite else {"postgresql_readonly": True}
        self.read_engine = self.engine.execution_options(**options)
        self.read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def session(self) -> AbstractContextManager[Session]:
        return self._transaction(self.sessions)

    @property
    def sqlite_path(self) -> str:
        """The SQLite database's file ("" for another database or one in memory)."""
        return (make_url(self.url).database or "") if self.is_sqlite else ""

    def read_session(self) -> AbstractContextManager[Session]:
        """A session whose transaction only reads: it never takes or waits for SQLite's write lock
        (writers go on while it reads), and on Postgres it is a READ ONLY transaction. A write in
        it is an error. For every route that only reads, so that a reader never delays a writer."""
        return self._transaction(self.read_sessions)

    @contextmanager
    def _transaction(self, sessions: sessionmaker[Session]) -> Iterator[Session]:
        try:
            with sessions.begin() as session:
                yield session
        except OperationalError as exc:
            raise ServiceUnavailableError(
                f"the database is unreachable ({_short(exc)}); "
                "check AUTORL_DATABASE_URL and that the database is running"
            ) from exc
        except DatabaseError as exc:  # a SQLite file damaged past its header
            if self.sqlite_path and str(exc.orig).startswith(SQLITE_NOT_A_DATABASE):
                raise not_a_database(self.sqlite_path, exc.orig or exc) from exc
            raise

    def ping(self) -> None:
        try:
            with self.read_engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            raise ServiceUnavailableError(f"the database is unreachable ({_short(exc)})") from exc

    def wait_until_ready(self, timeout_s: float | None = None) -> None:
        """Bounded retry at start-up (``DATABASE_WAIT_S`` by default): a database that starts after
        us is normal in Kubernetes. Logs what it waits for while it waits; past the time, a
        ServiceUnavailableError naming AUTORL_DATABASE_URL and the fix."""
        wait_s = DATABASE_WAIT_S if timeout_s is None else timeout_s
        start = time.monotonic()
        reported = None
        while True:
            try:
                self.ping()
                return
            except ServiceUnavailableError as exc:
                waited, why = time.monotonic() - start, _short(exc.__cause__ or exc)
                if waited >= wait_s:
                    raise ServiceUnavailableError(
                        f"the database at AUTORL_DATABASE_URL={shown_url(self.url)} is unreachable "
                        f"after {waited:.0f} s ({why}); check that it is running and that "
                        "AUTORL_DATABASE_URL names its host, port, user and password"
                    ) from exc
                if reported is None or waited - reported >= DATABASE_WAIT_REPORT_S:
                    reported = waited
                    log.warning(
                        "event=database_waiting waiting up to %.0f s more for the database at "
                        "AUTORL_DATABASE_URL=%s (%s)",
                        wait_s - waited,
                        shown_url(self.url),
                        why,
                    )
                time.sleep(min(1.0, max(wait_s - waited, 0.0)))

    def dispose(self) -> None:
        self.engine.dispose()


def _short(exc: BaseException) -> str:
    return str(getattr(exc, "orig", exc)).strip().splitlines()[0][:200]


def migrate(database: Database | str) -> None:
    """Upgrade the schema to the newest Alembic revision (idempotent; safe with concurrent callers on
    Postgres thanks to an advisory lock)."""
    # Alembic announces each of its autogenerate plugins at INFO as it is imported: noise in a
    # service's log; the migrations it runs are still logged.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config

    db = database if isinstance(database, Database) else Database(database)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", db.url.replace("%", "%%"))
    with db.engine.begin() as conn:
        if not db.is_sqlite:
            conn.execute(text("SELECT pg_advisory_xact_lock(7411)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
