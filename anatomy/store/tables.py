"""The store's tables, declared once: SQLite and PostgreSQL are made from this, the rows' columns
are read from it, and the migrations (store/migrations/) start from it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    text,
)

metadata = MetaData()


def _run_id() -> Column:
    return Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)


runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", Text),
    Column("created_at", Double, nullable=False),  # wall clock, seconds since the epoch
    Column("ended_at", Double),
    Column("status", Text, nullable=False),
    Column("preset", Text, nullable=False),
    Column("options", Text, nullable=False),  # JSON of RunOptions
    Column("environment", Text, nullable=False, server_default=text("'{}'")),
    Column("backend", Text, nullable=False),  # "nvml" or "cpu-rss"
    Column("memory_api", Text),  # "v2", "v1" (NVML) or "rss"
    Column("gpu", Integer, nullable=False, server_default=text("0")),  # the device that trains
    Column("summary", Text, nullable=False, server_default=text("'{}'")),
    Column("error", Text),
    Column("samples_sent", BigInteger),
    Column("tags", Text, nullable=False, server_default=text("''")),
    Column("sweep", Text),
    Column("worker_pid", Integer),  # the training process (a user's script for attached runs)
    Column("source", Text, nullable=False, server_default=text("'{}'")),  # RunRow.source
    Column("origin", Text),  # JSON: where an imported run came from (RunRow.origin)
    Column("recorder", Text),  # JSON: the process recording it (RunRow.recorder)
    # A run across hosts: the key every host of its launch has (torchrun's rendezvous id, or
    # ANATOMY_RUN_KEY), and how many hosts it has (store/launches.py).
    Column("run_key", Text),
    Column("host_count", Integer),
    sqlite_autoincrement=True,
)
# The one running run of a launch: the first host to arrive makes it, the others find it
# (insert-or-select); a key may be given again to a later launch once that run has ended.
RUNNING_KEY = text("run_key IS NOT NULL AND status = 'running'")
Index("runs_running_key", runs.c.run_key, unique=True, sqlite_where=RUNNING_KEY,
      postgresql_where=RUNNING_KEY)

# Each host of a run across hosts: its place (0, 1, … in the order they arrived: its GPU i is
# stored as device_key(host, i)), its recorder, when it last said it is alive, how it ended.
run_hosts = Table(
    "run_hosts", metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("host", Integer, primary_key=True),
    Column("name", Text, nullable=False),
    Column("recorder", Text, nullable=False),  # JSON, as runs.recorder
    Column("wall_t0", Double, nullable=False),  # the wall clock at its recording's start
    Column("beat", Double, nullable=False),  # the wall clock of its last word
    Column("ranks", Text, nullable=False, server_default=text("'{}'")),  # JSON {rank: gpu}
    Column("ended_at", Double),
    Column("status", Text),  # how its part ended; "failed" too for a host found lost
    Column("error", Text),
    Column("samples_sent", BigInteger),
)

samples = Table(
    "samples", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("used", BigInteger, nullable=False),
    Column("reserved", BigInteger),
    Column("total", BigInteger),
    Column("util", Integer),
)
Index("samples_run", samples.c.run_id, samples.c.gpu, samples.c.t)

def _extremes() -> list[Column]:
    """A bucket's lowest and highest sample, each with its time, and the reserved and total
    bytes beside the highest: what every width of bucket keeps."""
    return [Column("t_min", Double, nullable=False), Column("used_min", BigInteger, nullable=False),
            Column("t_max", Double, nullable=False), Column("used_max", BigInteger, nullable=False),
            Column("reserved", BigInteger), Column("total", BigInteger)]


# Each 0.1 s of samples as its min and max (kept as samples arrive): long runs draw from here.
sample_buckets = Table(
    "sample_buckets", metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("gpu", Integer, primary_key=True),
    Column("bucket", BigInteger, primary_key=True),  # floor(t / BUCKET_SECONDS)
    *_extremes(),
)

# The same min and max over coarser spans, kept beside them: level L's bucket is
# BUCKET_SECONDS * BUCKET_RATIO**L wide (store/database.py), the union of whole finer ones, so a
# long run's chart and its peaks read a few thousand rows, not one row per 0.1 s (192,000 for
# 32 GPUs' 10 minutes). Level before gpu: the chart reads one level of every GPU.
coarse_buckets = Table(
    "coarse_buckets", metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("level", Integer, primary_key=True),
    Column("gpu", Integer, primary_key=True),
    Column("bucket", BigInteger, primary_key=True),  # floor(t / its level's width)
    *_extremes(),
)

phases = Table(
    "phases", metadata,
    _run_id(),
    Column("name", Text, nullable=False),
    Column("start", Double, nullable=False),  # the state is reached (the weights are in)
    Column("end", Double),  # the next step begins: the phase's memory is read here
    # A run of several training processes: each phase and step names its rank.
    Column("rank", Integer, nullable=False, server_default=text("0")),
)

steps = Table(
    "steps", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("step", Integer, nullable=False),
    Column("total", Integer),
    Column("loss", Double),
    Column("allocated", BigInteger),
    Column("reserved", BigInteger),
    Column("rank", Integer, nullable=False, server_default=text("0")),
    Column("seq_len", Integer),  # the sequence length each step of a user's Trainer trained at
)
Index("steps_run", steps.c.run_id, steps.c.step)
# One rank's steps in time order: the Live page reads the reference rank's steps, its first and
# last and its count every refresh, which scanned every rank's (38,400 rows for 32 ranks' 10
# minutes).
Index("steps_rank", steps.c.run_id, steps.c.rank, steps.c.t)

messages = Table(
    "messages", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("level", Text, nullable=False),
    Column("text", Text, nullable=False),
)

# The device panel (a few readings a second, beside the samples): the host, each GPU, and every
# process on a GPU.
host_status = Table(
    "host_status", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("cpu_percent", Double),
    Column("ram_used", BigInteger, nullable=False),
    Column("ram_total", BigInteger, nullable=False),
    # Its place among a run's hosts (run_hosts.host): each host's panel, as its GPUs' keys say.
    Column("host", Integer, nullable=False, server_default=text("0")),
)
Index("host_status_run", host_status.c.run_id, host_status.c.t)

gpu_status = Table(
    "gpu_status", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("util", Integer),
    Column("power_w", Double),
    Column("power_limit_w", Double),
    Column("temperature_c", Integer),
)
Index("gpu_status_run", gpu_status.c.run_id, gpu_status.c.t)

gpu_processes = Table(
    "gpu_processes", metadata,
    _run_id(),
    Column("t", Double, nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("name", Text),
    Column("used", BigInteger),
)
Index("gpu_processes_run", gpu_processes.c.run_id, gpu_processes.c.t)

sweeps = Table(
    "sweeps", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # What runs.sweep holds: unique across stores, so a run imported from another machine never
    # joins a local sweep of the same id.
    Column("key", Text, nullable=False, unique=True),
    Column("name", Text),
    Column("created_at", Double, nullable=False),
    Column("ended_at", Double),
    Column("base", Text, nullable=False),  # JSON of the base RunOptions
    Column("vary", Text, nullable=False),  # JSON {option: [values]}, as planned
    Column("until_oom", Integer, nullable=False, server_default=text("0")),
    Column("planned", Integer, nullable=False),  # runs in the plan; an until-oom ladder may add more
    # Planned runs dropped after an oom in their ladder.
    Column("skipped", Integer, nullable=False, server_default=text("0")),
    Column("status", Text, nullable=False),  # running, completed, stopped, failed
    Column("error", Text),
    Column("pid", Integer),  # the process running it: a sweep whose process ended is over
    sqlite_autoincrement=True,
)

# The store's own facts: "id", a random name that an export carries, so an import knows which
# store a run came from.
store_info = Table(
    "store_info", metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)
