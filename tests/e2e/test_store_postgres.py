"""The store's tests, the CLI's and the import's, run again on PostgreSQL: each test's store is a
fresh database of a private cluster (tests/postgres.py) instead of a file, named by URL to the
Store, to --store and to $ANATOMY_STORE. A test about a file as such (its folder, its
permissions, SQLite's own errors) stays with SQLite only."""

from __future__ import annotations

import inspect
from pathlib import Path

import psycopg
import pytest

from anatomy.cli import main
from anatomy.store import STORE_ENV, Message, Store, StoreError, database, schema
from tests.conftest import seed_run
from tests.postgres import PASSWORD
from tests.unit import test_cli_admin, test_store, test_transfer

# Tests of a SQLite file as such: its folder, SQLite's journal, a file made before revisions.
FILE_ONLY = {
    "test_a_store_written_before_a_column_existed_gains_it", "test_store_is_in_wal_mode",
    # a fault or an odd row made in SQLite's own SQL (a trigger, a file's bytes)
    "test_a_failure_while_writing_leaves_nothing_half_imported",
    "test_a_run_whose_recorder_is_gone_reads_as_ended_and_nothing_is_written",
}


def _again(module) -> None:
    for name, test in vars(module).items():
        if name.startswith("test_") and name not in FILE_ONLY and callable(test) \
                and {"store", "source", "target"} & set(inspect.signature(test).parameters):
            globals()[name] = test


for _module in (test_store, test_cli_admin, test_transfer):
    _again(_module)
runs = test_cli_admin.runs  # its fixture, over this module's store


@pytest.fixture(autouse=True)
def _own_store(pg_url, monkeypatch):
    """Every test's store is its own database, named by URL wherever a file was; the
    connections this process keeps to it are closed after the test."""
    monkeypatch.setenv(STORE_ENV, pg_url)
    yield
    for key, engine in list(database._ENGINES.items()):
        if engine.dialect.name == "postgresql":
            engine.dispose()
            del database._ENGINES[key]


@pytest.fixture
def store(pg_url) -> Store:
    return Store(pg_url)


@pytest.fixture
def source(postgres) -> tuple[Store, list[int]]:
    """tests/conftest.py's three runs, in a database."""
    store = Store(postgres.new_database(password=False))
    done = seed_run(store, gpus=2)
    store.write(done, messages=[Message(0.5, "warning", "eval_strategy 'no'")])
    store.rename_run(done, "walkthrough")
    store.set_tags(done, ["h200", "baseline"])
    store.update_run(done, sweep="abc123")
    oom = seed_run(store, status="oom", error="CUDA out of memory. Tried to allocate 1.00 GiB")
    running = seed_run(store, status="running")
    return store, [done, oom, running]


@pytest.fixture
def target(postgres) -> Store:
    store = Store(postgres.new_database(password=False))
    seed_run(store)
    return store


# --- faults of a database server, and its password ---

def test_a_database_restart_mid_recording_keeps_the_samples_and_writes_them_when_it_is_back(
        postgres, store):
    from anatomy.engine import protocol
    from anatomy.engine.collector import Collector
    from anatomy.store import Sample

    run_id = store.create_run({"model": "tiny"}, "nvml", "v2", 0, {})
    said = []
    collector = Collector(store, run_id, say=said.append)

    def record(start: int) -> None:
        collector.handle(protocol.Samples([Sample(i / 100, 0, 2**30 + i, None, None, None)
                                           for i in range(start, start + 100)]))

    record(0)
    assert collector.flush()
    postgres.stop()
    try:
        record(100)
        assert not collector.flush()  # kept
        record(200)
        assert not collector.flush()
        assert len(said) == 1 and "cannot be reached" in said[0]
    finally:
        postgres.start()
    assert collector.flush()
    assert said[1].startswith(f"the store {store.path} is back after") and "200 samples" in said[1]
    assert store.sample_count(run_id) == 300
    assert [s.t for s in store.samples(run_id)] == [i / 100 for i in range(300)]
    # Both lines are the run's messages once that flush is done: it may be the run's last.
    assert [m.text for m in store.messages(run_id)] == said


def test_every_write_of_a_recording_waits_out_a_database_restart_and_goes_in_in_order(
        postgres, store):
    """Phase marks, steps, notes, the facts and name a training reports and the run's own
    changes, made while the server is down, are kept and written in order once it is back; the
    run's messages say when it went and came back."""
    from anatomy.engine import protocol
    from anatomy.engine.collector import Collector
    from anatomy.store import PhaseMark, RunFacts, Sample, Step

    run_id = store.create_run({"model": "tiny"}, "nvml", "v2", 0, {})
    said = []
    collector = Collector(store, run_id, say=said.append)
    rank0 = protocol.Source(rank=0)
    collector.handle(protocol.Samples([Sample(0.0, 0, 2**30, None, None, None)]))
    collector.handle(protocol.Phase(PhaseMark("start", "training", 0.0), rank0))
    assert collector.flush()
    postgres.stop()
    try:
        collector.handle(protocol.Samples([Sample(i / 10, 0, 2**30 + i, None, None, None)
                                           for i in range(1, 30)]))
        collector.handle(protocol.StepReport(Step(1.0, 1, 2, 3.5, None, None), rank0))
        collector.handle(protocol.Environment(RunFacts.of(torch="2.13.0"), rank0))
        collector.handle(protocol.Named("while it was down", rank0))
        collector.handle(protocol.Described({"batch_size": 4}, "my-model", rank0))
        collector.handle(protocol.Note(Message(2.0, "info", "a user's note"), rank0))
        collector.handle(protocol.StepReport(Step(2.5, 2, 2, 3.0, None, None), rank0))
        collector.handle(protocol.Phase(PhaseMark("end", "training", 2.9), rank0))
        collector.change_run(worker_pid=4321)
        assert not collector.flush()
        assert not collector.flush()
    finally:
        postgres.start()
    assert collector.flush()
    assert len(said) == 2 and "cannot be reached" in said[0] and "is back after" in said[1]
    assert store.sample_count(run_id) == 30
    assert [(p.name, p.start_s, p.end_s) for p in store.phases(run_id)] == [("training", 0.0, 2.9)]
    assert [s.step for s in store.steps(run_id)] == [1, 2]
    run = store.run(run_id, as_recorded=True)
    assert (run.name, run.preset, run.options["batch_size"], run.environment.torch,
            run.worker_pid) == ("while it was down", "my-model", 4, "2.13.0", 4321)
    texts = [m.text for m in store.messages(run_id)]
    assert said[0] in texts and "a user's note" in texts
    collector.flush()  # the line of its return goes in with the next write
    assert store.messages(run_id)[-1].text == said[1]


def test_past_its_bound_an_outage_thins_the_samples_kept_and_keeps_every_peak_and_phase(
        postgres, store, monkeypatch):
    """More samples than the collector keeps for an outage: each 0.1 s of each GPU is kept as
    its lowest and highest reading (the chart and every peak survive), said in a line and in
    the run's messages; phases and steps are never dropped."""
    from anatomy.engine import collector as collector_module
    from anatomy.engine import protocol
    from anatomy.store import PhaseMark, Sample, Step

    monkeypatch.setattr(collector_module, "KEPT_SAMPLES", 1000)
    run_id = store.create_run({"model": "tiny"}, "nvml", "v2", 0, {})
    said = []
    collector = collector_module.Collector(store, run_id, say=said.append)
    rank0 = protocol.Source(rank=0)
    collector.handle(protocol.Phase(PhaseMark("start", "training", 0.0), rank0))
    postgres.stop()
    try:
        for second in range(4):  # 4 s at 1 kHz on 2 GPUs, flushed as the recording does
            collector.handle(protocol.Samples([
                Sample(second + i / 1000, gpu, 2**30 + (5 * 2**30 if (second, i, gpu) == (2, 517, 1)
                                                        else i * 1024), None, None, None)
                for i in range(1000) for gpu in (0, 1)]))
            collector.handle(protocol.StepReport(Step(second + 0.5, second + 1, 4, 1.0, None,
                                                      None), rank0))
            assert not collector.flush()
        collector.handle(protocol.Phase(PhaseMark("end", "training", 4.0), rank0))
        assert not collector.flush()
    finally:
        postgres.start()
    assert collector.flush()
    collector.flush()
    stored = store.samples(run_id)
    assert len(stored) <= 1000 + 2 * 1000  # thinned to the bound's size at most once more
    assert max(s.used for s in stored) == 6 * 2**30  # the peak, at its own time
    assert [(s.t, s.gpu) for s in stored if s.used == 6 * 2**30] == [(2.517, 1)]
    assert {s.gpu for s in stored} == {0, 1} and min(s.t for s in stored) == 0.0
    assert [p.end_s for p in store.phases(run_id)] == [4.0]
    assert [s.step for s in store.steps(run_id)] == [1, 2, 3, 4]
    thinned = [line for line in said if "thinned" in line]
    assert len(thinned) == 1 and "lowest and highest reading" in thinned[0]
    assert thinned[0] in [m.text for m in store.messages(run_id)]


def test_a_cli_run_through_a_database_restart_is_whole_and_says_so_each_way(postgres, pg_url):
    """`anatomy run` whose server stops while the worker starts (its facts, phases, steps and
    ending all come while it is down or after) and is back 8 s later: the run completes with
    every sample, phase and step, the CLI prints a line each way and the run's messages keep
    them."""
    import subprocess
    import sys
    import time
    from dataclasses import replace

    from tests.conftest import PROJECT, TINY, flags
    from tests.helpers import wait_until

    store = Store(pg_url)
    run = subprocess.Popen([sys.executable, "-m", "anatomy", "run", "--store", pg_url,
                            *flags(replace(TINY, max_steps=12))], cwd=PROJECT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: store.runs() and store.sample_count(store.runs()[0].id), 120,
                   "the run's first samples", process=run)
        postgres.stop()
        try:
            time.sleep(8)
        finally:
            postgres.start()
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, err
    recorded = store.runs()[0]
    assert recorded.status == "completed" and recorded.environment.torch is not None
    assert store.sample_count(recorded.id) == recorded.samples_sent > 0
    assert [p.end_s is not None for p in store.phases(recorded.id)] == [True] * 4
    assert store.step_count(recorded.id) == 12
    said = [line for line in err.splitlines() if line.startswith(f"run {recorded.id}: ")
            and ("cannot be reached" in line or "is back after" in line)]  # as it happened
    assert len(said) == 2 and "cannot be reached" in said[0], err
    # said once: the run's end printed them again from its messages, as "warning: …"
    assert not [line for line in err.splitlines() if line.startswith("warning: the store")], err
    texts = [m.text for m in store.messages(recorded.id)]
    assert [t for t in texts if "cannot be reached" in t or "is back after" in t] == \
        [line.split(": ", 1)[1] for line in said]
    assert PASSWORD not in out + err


def test_a_run_whose_server_is_gone_for_good_at_its_end_keeps_what_it_recorded_past_a_ctrl_c(
        postgres, pg_url, tmp_path, monkeypatch):
    """`anatomy run` whose server stops for good while it trains: once the training has ended it
    says so, and where what waits for the store is kept; Ctrl-C then ends the CLI, and the next
    manager on that store (the next `anatomy run`, the dashboard) writes it in, with the run's
    true ending (before: the rows died with the CLI, the run read "failed: ended without a
    word" and lost its training phase's end and its steps)."""
    import signal
    import subprocess
    import sys
    from dataclasses import replace

    from anatomy.engine.recording import end_orphans
    from tests.conftest import PROJECT, TINY, flags
    from tests.helpers import wait_until

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # where the rows are kept
    store = Store(pg_url)
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        run = subprocess.Popen([sys.executable, "-m", "anatomy", "run", "--store", pg_url,
                                *flags(replace(TINY, max_steps=12))], cwd=PROJECT, text=True,
                               stdout=subprocess.PIPE, stderr=stderr)
    try:
        wait_until(lambda: store.runs() and store.sample_count(store.runs()[0].id), 120,
                   "the run's first samples", process=run)
        run_id = store.runs()[0].id
        postgres.stop()
        try:
            said = wait_until(lambda: [line for line in err.read_text().splitlines()
                                       if line.startswith(f"run {run_id}: the training has ended")],
                              120, "a line saying the training has ended", process=run,
                              seen=err.read_text)
            run.send_signal(signal.SIGINT)
            out, _ = run.communicate(timeout=60)
        finally:
            postgres.start()
    finally:
        run.kill()
    kept = list((tmp_path / "data" / "anatomy" / "kept").iterdir())
    assert len(kept) == 1 and str(kept[0]) in said[0] and "completed" in said[0], said
    # stopped by Ctrl-C: its status, not the store's error after the line saying where it went
    assert run.returncode == 130, \
        (run.returncode, err.read_text().splitlines()[-3:])
    assert PASSWORD not in out + err.read_text()
    assert end_orphans(store) == [run_id]
    recorded = store.run(run_id)
    assert (recorded.status, recorded.error) == ("completed", None)
    assert store.sample_count(run_id) == recorded.samples_sent > 0
    assert [p.end_s is not None for p in store.phases(run_id)] == [True] * 4
    assert store.step_count(run_id) == 12
    texts = [m.text for m in store.messages(run_id)]
    assert [t for t in texts if "cannot be reached" in t] and \
        [t for t in texts if str(kept[0]) in t and "written" in t], texts
    assert not kept[0].exists()  # written once


def test_a_predicted_peak_waits_for_a_database_server_that_is_away(postgres, store):
    """The predicted peak's process (a Trainer callback's, `anatomy run --metrics-port`'s: engine/
    predicting.py) started while the store's server is away tries it again until it is back, as
    the recording waits for it, then answers with the peak (before: at once, "no predicted peak
    for the Trainer's logs: the store …: Connection refused")."""
    import socket
    import threading

    from anatomy.engine.predicting import Predicting
    from tests.conftest import seed_run
    from tests.helpers import wait_until

    run_id = seed_run(store)
    options = store.run(run_id, as_recorded=True).options
    store.update_run(run_id, options={**options, "model": "tiny"})  # quick to predict
    answers, answered, tries, over = [], threading.Event(), [], threading.Event()

    def stand_in(listener: socket.socket) -> None:  # the server's port, closing on every try
        while not over.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            tries.append(1)
            connection.close()

    postgres.stop()
    try:
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", postgres.port))
            listener.listen()
            listener.settimeout(0.2)
            seen = threading.Thread(target=stand_in, args=(listener,))
            seen.start()
            try:
                Predicting(store.locator(), run_id, None,
                           lambda answer: (answers.append(answer), answered.set()))
                wait_until(lambda: answered.is_set() or len(tries) >= 6, 120,
                           "the prediction's tries of the store", seen=lambda: answers)
            finally:
                over.set()
                seen.join()
        assert not answered.is_set(), answers
    finally:
        postgres.start()
    assert answered.wait(300)
    (answer,) = answers
    assert answer.why is None and answer.peak > 0, answer


def test_wrong_credentials_or_no_server_at_start_are_one_line_and_nothing_starts(
        postgres, capsys):
    wrong = postgres.url("postgres", password="not-it")
    for url, why in ((wrong, 'password authentication failed for user "anatomy"'),
                     (postgres.url("postgres").replace(f":{postgres.port}/", ":1/"),
                      "Connection refused")):
        for command in (["runs"], ["run", "--model", "tiny", "--max-steps", "1"]):
            capsys.readouterr()
            assert main([*command, "--store", url]) in (1, 2)
            out, err = capsys.readouterr()
            assert len(err.splitlines()) == 1 and why in err, err
            assert "not-it" not in out + err and PASSWORD not in out + err
    assert store_runs(postgres) == []


def store_runs(postgres) -> list:
    """The runs of the cluster's own database: none was started by a refused command."""
    return Store(postgres.url("postgres")).runs() if _has_runs(postgres) else []


def _has_runs(postgres) -> bool:
    import psycopg
    with psycopg.connect(postgres.url("postgres")) as db:
        return db.execute("SELECT to_regclass('runs')").fetchone()[0] is not None


def test_a_urls_password_is_in_no_line_run_or_export(postgres, capsys, tmp_path):
    url = postgres.new_database(password=True)
    run_id = seed_run(Store(url))
    for command in (["runs"], ["show", str(run_id)],
                    ["export", str(run_id), "--format", "json", "--output", str(tmp_path / "out.json")]):
        capsys.readouterr()
        assert main([*command, "--store", url]) == 0
        out, err = capsys.readouterr()
        assert PASSWORD not in out + err
    exported = (tmp_path / "out.json").read_text()
    assert PASSWORD not in exported and ":***@" in exported  # where the run came from


def test_the_dashboard_over_a_store_its_role_cannot_write_falls_back_to_read_only(
        postgres, pg_url, monkeypatch, capsys):
    """A role granted SELECT only (the honest unwritable store as root, who may write any file)."""
    from anatomy.cli import dashboard
    from anatomy.dashboard import READ_ONLY_ENV

    seed_run(Store(pg_url))
    name = pg_url.rsplit("/", 1)[1]
    postgres.sql("CREATE ROLE reader LOGIN PASSWORD 'r3ad'")
    try:
        postgres.sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader", name)
        reader = postgres.url(name, password="r3ad", user="reader")
        assert not Store(reader).writable() and Store(pg_url).writable()
        started = {}

        def execve(program, command, env):
            started.update(env)
            raise SystemExit(0)

        monkeypatch.setattr(dashboard.os, "execve", execve)
        with pytest.raises(SystemExit):
            main(["dashboard", "--store", reader, "--port", "8599"])
        out = capsys.readouterr().out
        assert "read-only: the store cannot be written by this user" in out and "r3ad" not in out
        assert started[READ_ONLY_ENV] == "the store cannot be written by this user"
        assert started[STORE_ENV] == reader  # the server reaches it with the password
    finally:
        for engine in list(database._ENGINES.values()):
            engine.dispose()
        postgres.sql("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM reader", name)
        postgres.sql("DROP ROLE reader")


CUT_OFF_COPY = """
import sys, time
import psycopg
from anatomy.store import DatabaseError, Store, tables
from tests.conftest import seed_run

url = sys.argv[1]
store = Store(url)
run_id = seed_run(store)


class Rows:
    \"\"\"Samples whose COPY loses its server after the first: its backend is ended.\"\"\"
    def __len__(self):
        return 200_000

    def __iter__(self):
        yield (run_id, 0.0, 0, 1, None, None, None)
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name = 'anatomy'")
        time.sleep(0.5)
        for i in range(1, len(self)):
            yield (run_id, i / 1000, 0, i, None, None, None)


try:
    with store.connect() as db:
        db.append(tables.samples, Rows())
except DatabaseError:
    print("refused", flush=True)
"""


def test_a_copy_whose_server_goes_away_is_one_error_and_nothing_on_the_terminal(pg_url, tmp_path):
    """psycopg logs what it ignores ending a COPY the server cut off; with no handler of the
    program's, Python's last resort printed it to the user's terminal beside anatomy's line
    (an `anatomy import` or a recording whose server stopped mid-write): "error ignored
    terminating <psycopg.Copy [BAD] at 0x7f8e46116e90>: the connection is lost"."""
    import subprocess
    import sys

    from tests.conftest import PROJECT

    done = subprocess.run([sys.executable, "-c", CUT_OFF_COPY, pg_url], capture_output=True,
                          text=True, cwd=PROJECT, timeout=120)
    assert (done.stdout, done.stderr) == ("refused\n", "")


def test_a_role_that_may_not_make_or_upgrade_the_stores_tables_is_told_what_it_lacks(
        postgres, pg_url, capsys, monkeypatch):
    """A role without CREATE on a new database's schema was told PostgreSQL's bare "permission
    denied for schema public"; one that may write the runs of a store an older anatomy made
    (revision 0003) "must be owner of table host_status", nothing of the upgrade that needed it,
    and the dashboard refused it, where a store it cannot write is shown read-only."""
    from anatomy.cli import dashboard
    from anatomy.dashboard import READ_ONLY_ENV

    name = pg_url.rsplit("/", 1)[1]
    postgres.sql("CREATE ROLE scribe LOGIN PASSWORD 'scr1be'")
    scribe = postgres.url(name, password="scr1be", user="scribe")
    try:
        assert main(["tag", "1", "x", "--store", scribe]) == 1  # no store there yet
        capsys.readouterr()
        with pytest.raises(StoreError) as refused:
            Store(scribe)
        assert str(refused.value).endswith(
            ": it cannot be written by the role scribe, which may not make anatomy's tables in"
            " this database (permission denied for schema public): run anatomy once as a role"
            " that may (its owner), or grant scribe CREATE on the schema")
        run_id = seed_run(Store(pg_url))
        with psycopg.connect(postgres.url(name)) as db:  # as anatomy at 0003 left it
            db.execute("ALTER TABLE host_status DROP COLUMN host")
            db.execute("UPDATE alembic_version SET version_num = '0003'")
        for grant in ("SELECT, INSERT, UPDATE, DELETE ON ALL TABLES", "USAGE ON ALL SEQUENCES"):
            postgres.sql(f"GRANT {grant} IN SCHEMA public TO scribe", name)
        assert main(["tag", str(run_id), "x", "--store", scribe]) == 2
        assert capsys.readouterr().err == (
            f"error: the store {scribe.replace(':scr1be@', ':***@')}: it cannot be written by the"
            " role scribe: an older anatomy made it (schema revision 0003), which this one"
            f" upgrades to {schema.HEAD} before it writes, and scribe may not (must be owner of"
            " table host_status): run anatomy once as its tables' owner to upgrade it\n")
        started = {}

        def execve(program, command, env):
            started.update(env)
            raise SystemExit(0)

        monkeypatch.setattr(dashboard.os, "execve", execve)
        with pytest.raises(SystemExit):  # the dashboard shows it, read-only (before: refused)
            main(["dashboard", "--store", scribe, "--port", "8599"])
        assert "upgrades to" in started[READ_ONLY_ENV] and started[STORE_ENV] == scribe
        assert main(["tag", str(run_id), "x", "--store", pg_url]) == 0  # the owner upgrades it
        assert main(["tag", str(run_id), "y", "--store", scribe]) == 0
    finally:
        for engine in list(database._ENGINES.values()):
            engine.dispose()
        postgres.sql("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM scribe", name)
        postgres.sql("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM scribe", name)
        postgres.sql("DROP ROLE scribe")


# --- the dashboard on PostgreSQL, in a real browser ---

@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(),
                    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")
@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_the_dashboard_on_postgresql_lists_the_run_and_draws_its_chart_in_a_browser(
        pg_url, chromium, tmp_path, read_only):
    """`anatomy dashboard --store postgresql://…` (the password from $PGPASSWORD): the Runs
    page lists the seeded run and draws its chart; `--read-only` offers no Delete, Save or Start
    and says why in the sidebar, where the writable one offers them."""
    import sys

    from tests.conftest import PROJECT
    from tests.e2e.conftest import serve, stop
    from tools.browser import wait_for_charts

    store = Store(pg_url)
    run_id = seed_run(store, gpus=2)
    store.rename_run(run_id, "on the team's server")
    process, url, log = serve([sys.executable, "-m", "anatomy", "dashboard", "--port", "{port}",
                               "--store", pg_url, *(["--read-only"] if read_only else [])],
                              cwd=PROJECT, log_path=tmp_path / "server.log")
    try:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/runs?run={run_id}")
        wait_for_charts(page, 1)
        # The run's heading: the list's own cell of the name is a hidden one of its grid.
        page.get_by_text("on the team's server").filter(visible=True).first.wait_for(
            timeout=60_000)
        page.locator("[data-testid=stDataFrame]").first.wait_for(timeout=60_000)  # the list
        page.wait_for_timeout(1000)
        name = "runs-postgresql" + ("-read-only" if read_only else "") + "-1280.png"
        page.screenshot(path=tmp_path / name)  # docs/screenshots keeps one taken so
        writing = [page.get_by_role("button", name=f"Delete run {run_id}…").count(),
                   page.get_by_role("button", name="Save").count()]
        sidebar = page.locator("[data-testid=stSidebar]").inner_text()
        page.goto(url)  # the Live page: its Start
        page.get_by_text("Live run").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        writing.append(page.get_by_role("button", name="Start").count())
    finally:
        logged = stop(process, log)
    if read_only:
        assert writing == [0, 0, 0] and "Read-only: asked for (--read-only)" in sidebar
    else:
        assert all(writing) and "Read-only" not in sidebar
    assert "Traceback" not in logged and PASSWORD not in logged


def test_a_cluster_whose_maker_is_killed_is_stopped_and_removed(postgres):
    """`pg_ctl start` leaves the server to run on its own: a test process killed (a CI job cut at
    its limit) left its cluster running after the run. Its watchdog stops and removes it."""
    import signal
    import subprocess
    import sys

    import psutil

    from tests.helpers import wait_until

    maker = subprocess.Popen(
        [sys.executable, "-c", "from tests.postgres import Cluster, binaries; import sys, time; "
         "c = Cluster(binaries()); print(c.folder, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        folder = Path(maker.stdout.readline().strip())
        server = int((folder / "data" / "postmaster.pid").read_text().split()[0])
        assert psutil.pid_exists(server)
    finally:
        maker.send_signal(signal.SIGKILL)
        maker.wait()
    wait_until(lambda: not psutil.pid_exists(server) and not folder.exists(), 60,
               "the killed maker's cluster to be stopped and removed")
