"""One clock for the whole fleet: the database's.

- Two real ``tiletune server`` replicas on one PostgreSQL store, one of them on a clock 120 s
  ahead (libfaketime preloaded): a lease heartbeated every second, alternately through either,
  lives through several lease times while both reap; the shifted replica reports its skew
  (``tiletune_clock_skew_seconds``) and warns.
- :class:`~tiletune.service.scheduling.store_clock.StoreClock` in process, on real PostgreSQL and SQLite: the
  offset of a shifted host clock is measured and taken off, and kept while the database cannot be
  reached; SQLite is the host's clock, with no query.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, event, text

from tests.service.conftest import POSTGRES_ADMIN_URL, postgres_database
from tests.service.processes import start_server, stop
from tests.service.test_miss_reports_and_heartbeats import lease_a_job, token
from tiletune.service.database import normalize_url, utc_now
from tiletune.service.migrate import upgrade
from tiletune.service.scheduling.store_clock import StoreClock

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
STORE_CLOCK_LOGGER = "tiletune.service.scheduling.store_clock"
AHEAD_S = 120.0
AHEAD = {
    "LD_PRELOAD": FAKETIME_LIB,
    "FAKETIME": f"+{AHEAD_S:g}s",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # timers and waits keep real time; only the date moves
}
#: Heartbeats sent: over three of FAST_LEASES' 4-second leases, at one a second.
HEARTBEATS = 14
#: How well the offset is measured over loopback (half a round trip, and the clock's own steps).
MEASURED_WITHIN_S = 0.25


def _skew_of(url: str) -> float:
    exposition = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^tiletune_clock_skew_seconds (\S+)$", exposition, re.MULTILINE)
    assert found is not None, exposition[:2000]
    return float(found.group(1))


def test_a_replica_on_a_clock_ahead_keeps_every_heartbeating_lease(tmp_path: Path) -> None:
    assert Path(FAKETIME_LIB).exists(), "libfaketime is missing: `make setup` installs it"
    with postgres_database() as db_url:
        first = start_server(tmp_path, db_url=db_url)
        ahead = start_server(tmp_path, db_url=db_url, env=AHEAD, log_name="ahead.log")
        try:
            with httpx.Client(base_url=first.url, timeout=30) as http:
                worker = token(http, "worker")
                lease = {**worker, "X-Lease-Token": lease_a_job(http, worker)}
            answers = []
            for beat in range(HEARTBEATS):
                replica = (first, ahead)[beat % 2]
                answers.append(httpx.post(f"{replica.url}/v1/lease/heartbeat", headers=lease, timeout=30))
                time.sleep(1.0)
            assert [answer.status_code for answer in answers] == [200] * HEARTBEATS, answers[-1].text
            assert _skew_of(ahead.url) == pytest.approx(-AHEAD_S, abs=MEASURED_WITHIN_S)
            assert abs(_skew_of(first.url)) < MEASURED_WITHIN_S
            expired = httpx.get(f"{ahead.url}/metrics", timeout=10).text
            assert re.search(r"^tiletune_leases_expired_total 0\.0$", expired, re.MULTILINE)
        finally:
            stop(ahead.process)
            stop(first.process)
        assert "this replica's clock is 120.0 s ahead of the database's" in ahead.log(200)


def test_the_store_clock_takes_a_hosts_offset_off_and_keeps_it_while_the_store_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with postgres_database() as db_url:
        upgrade(db_url)
        engine = create_engine(normalize_url(db_url), connect_args={"connect_timeout": 2})
        name = db_url.rsplit("/", 1)[1]
        try:
            clock = StoreClock(engine, local=lambda: utc_now() + timedelta(seconds=AHEAD_S))
            with caplog.at_level(logging.WARNING, logger=STORE_CLOCK_LOGGER):
                clock.measure()
            assert clock.skew_s == pytest.approx(-AHEAD_S, abs=MEASURED_WITHIN_S)
            assert abs((clock() - utc_now()).total_seconds()) < MEASURED_WITHIN_S
            said = [record.getMessage() for record in caplog.records if record.name == STORE_CLOCK_LOGGER]
            assert len(said) == 1
            assert "120.0 s ahead of the database's" in said[0]

            measured = clock.skew_s
            engine.dispose()
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            with caplog.at_level(logging.WARNING, logger=STORE_CLOCK_LOGGER):
                clock.measure()
            assert clock.skew_s == measured, "a failed measurement keeps the last offset"
            assert "failed" in caplog.records[-1].getMessage()
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            engine.dispose()
    admin.dispose()


def test_sqlite_is_the_hosts_clock_and_queries_nothing(tmp_path: Path) -> None:
    sqlite = create_engine(f"sqlite:///{tmp_path / 'clock.db'}")
    queries: list[str] = []
    event.listen(sqlite, "before_cursor_execute", lambda *args: queries.append(args[2]))
    clock = StoreClock(sqlite, local=lambda: utc_now() + timedelta(seconds=AHEAD_S))
    clock.measure()
    assert clock.skew_s == 0.0
    assert queries == []
