"""Ranks on several hosts (issue 21), in this process: `--join`'s refusals, and a joining host's
messages moved onto the run's devices and clock as they become a source of its recording. (Two
hosts for real: tests/e2e/test_several_hosts.py.)"""

from __future__ import annotations

import queue

import pytest

from anatomy.cli import main
from anatomy.engine import hosts, protocol
from anatomy.store import HOST_STRIDE, GpuStatus, HostStatus, PhaseMark, Sample, Step


@pytest.mark.parametrize("text, port", [("node-0:29600", 29600), ("[::1]:7", 7)])
def test_a_join_address_is_host_and_port(text, port):
    assert hosts.join_address(text).port == port


# "²" is a digit to str.isdigit() that int() refuses (it raised ValueError), "٣" one it reads.
@pytest.mark.parametrize("text", ["node-0", "node-0:", ":29600", "node-0:http", "node-0:70000",
                                  "node-0:²", "node-0:٣"])
def test_a_bad_join_address_is_refused_in_one_line(text, capsys, monkeypatch):
    monkeypatch.setenv(hosts.JOIN_KEY_ENV, "k")
    assert main(["watch", "--join", text, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "not HOST:PORT" in err and err.count("\n") == 1


def test_joining_without_the_runs_key_is_refused_and_starts_nothing(capsys, monkeypatch, store):
    monkeypatch.delenv(hosts.JOIN_KEY_ENV, raising=False)
    assert main(["watch", "--join", "127.0.0.1:29600", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert hosts.JOIN_KEY_ENV in err and err.count("\n") == 1
    assert store.runs() == []


def _hosts() -> tuple[hosts.Hosts, hosts.Member, queue.Queue, queue.Queue]:
    samples, events = queue.Queue(), queue.Queue()
    found = hosts.Hosts(None, "node-0", t0=0.0, samples=samples, events=events,
                        on_lost=lambda member: None, on_join=lambda: None)
    member = hosts.Member(index=2, name="node-2", gpus=(4, 5), shift=1.5)
    found.members.append(member)
    return found, member, samples, events


def _drain(source: queue.Queue) -> list:
    out = []
    while not source.empty():
        out.append(source.get_nowait())
    return out


def test_a_joined_hosts_messages_land_on_the_runs_devices_and_clock():
    found, member, samples, events = _hosts()
    rank = protocol.Source(rank=3, pid=1, device=1)  # LOCAL_RANK 1: the host's second GPU
    found._pass_on(member, protocol.Samples([Sample(2.0, 5, 100, None, 200, None)]))
    found._pass_on(member, protocol.Phase(PhaseMark("start", "training", 3.0), rank))
    found._pass_on(member, protocol.StepReport(Step(4.0, 1, 9, 0.5, None, None), rank))
    found._pass_on(member, protocol.DeviceStatus(HostStatus(2.0, 1.0, 1, 2),
                                                 [GpuStatus(2.0, 5, 1, 1.0, 2.0, 30)], []))
    found._pass_on(member, protocol.WorkerLeft(9.0))
    found._pass_on(member, protocol.SamplerDone(41))
    found._pass_on(member, protocol.Failure("failed", "rank 3: boom", rank))
    [batch] = _drain(samples)
    assert batch.samples == [Sample(3.5, 2 * HOST_STRIDE + 5, 100, None, 200, None)]
    phase, step, failure = _drain(events)  # its device panel and its command's exit stay there
    assert phase.mark.t == 4.5 and step.step.t == 5.5 and step.source.rank == 3
    assert failure.text == "node-2: rank 3: boom"
    assert found.rank_places == {3: (2, 5)}  # rank 3 trains on node-2's GPU 5 (NVML)
    assert member.sent == 41 and found.samples_sent() == 41


def test_a_host_that_failed_or_was_lost_is_said_and_the_run_waits_for_every_host():
    found, member, _, _ = _hosts()
    assert not found.all_left() and found.failed() is None and found.lost() is None
    member.left = hosts.Left(1)
    assert found.all_left() and found.failed() == (member, "the command ended with exit code 1")
    member.left, member.lost = None, "its connection closed at 3.0 s"
    assert found.all_left() and found.lost() is member
    assert found.samples_sent() is None  # its sampler's count never came


def test_each_ranks_host_and_gpu_are_the_runs_facts():
    facts = hosts.places({0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, ["a", "b"])
    assert (facts.world_size, facts.hosts, facts.rank_hosts, facts.gpus) == (
        4, ("a", "b"), (0, 0, 1, 1), (0, 1, 0, 1))
    assert facts.to_dict() == {"world_size": 4, "hosts": ["a", "b"], "rank_hosts": [0, 0, 1, 1],
                               "gpus": [0, 1, 0, 1]}
    on_cpus = hosts.places({0: (0, None), 1: (1, None)}, ["a", "b"])
    assert on_cpus.gpus is None and on_cpus.rank_hosts == (0, 1)
