"""`anatomy export --format tensorboard`: a stored run as TensorBoard's event files, read back with
TensorBoard's own EventAccumulator, under the names the Trainer callback logs live."""

from __future__ import annotations

import pytest

from anatomy.cli import main
from tests.helpers import one_line


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: every event kept
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_a_stored_run_becomes_event_files_with_the_callbacks_names(seed, store, tmp_path,
                                                                    capsys):
    run_id = seed(gpus=2)  # 1, 2, 3, 4 GiB as the phases end at 1, 3, 5, 9 s; GPU 1 at 0.5 GiB
    output = tmp_path / "tb"
    assert main(["export", "--format", "tensorboard", "--output", str(output), str(run_id)]) == 0
    assert f"wrote {output / f'run-{run_id}'}" in capsys.readouterr().out
    scalars = _scalars(output / f"run-{run_id}")
    # each phase's memory, at the step it ended by (the seed's steps come every 0.4 s from 6.4 s;
    # its training ends at 9 s, after step 7)
    assert scalars["anatomy/weights_memory_mib"] == [(0, 3 * 1024)]
    assert scalars["anatomy/training_memory_mib"] == [(7, 4 * 1024)]
    # each step's peak per device, beside its loss
    assert [step for step, _ in scalars["anatomy/peak_mib/gpu0"]] == list(range(1, 9))
    assert {value for _, value in scalars["anatomy/peak_mib/gpu1"]} == {512}
    assert scalars["anatomy/loss"][0] == (1, 1.0)
    # every sample, on a millisecond axis
    timeline = scalars["anatomy/memory_mib/gpu0"]
    assert len(timeline) == len(store.samples(run_id, gpu=0))
    assert timeline[10] == (1000, 1024) and timeline[-1] == (9000, 4 * 1024)


@pytest.mark.parametrize("flags, words", [
    ([], "--format tensorboard writes a folder: give --output DIR"),
    (["--output", "{file}"], "it is a file"),
    (["--output", "{exported}"], "holds an export already"),
])
def test_what_the_tensorboard_export_cannot_write_is_refused_in_one_line(
        seed, tmp_path, capsys, flags, words):
    run_id = seed()
    (tmp_path / "file").write_text("x")
    exported = tmp_path / "exported"
    assert main(["export", "--format", "tensorboard", "--output", str(exported), str(run_id)]) == 0
    capsys.readouterr()
    flags = [f.format(file=tmp_path / "file", exported=exported) for f in flags]
    assert main(["export", "--format", "tensorboard", *flags, str(run_id)]) == 2
    assert words in one_line(capsys.readouterr().err)


def test_without_tensorboard_the_export_names_the_extra_and_writes_nothing(seed, tmp_path,
                                                                           capsys, monkeypatch):
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else found(name, *a))
    run_id = seed()
    assert main(["export", "--format", "tensorboard", "--output", str(tmp_path / "tb"),
                 str(run_id)]) == 2
    assert 'pip install "anatomy[tensorboard]"' in one_line(capsys.readouterr().err)
    assert not (tmp_path / "tb").exists()
