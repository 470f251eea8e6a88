"""A user's dataset files as they lie on the disk: what cannot be read (a split gone, a folder of
several formats) is refused in one line naming its option, and what can is read whole — never a
part of it taken for the whole. Files the user may not read: tests/e2e/test_datasets.py."""

from __future__ import annotations

import shutil
from dataclasses import replace

from anatomy.analysis.options import RunOptions, validate


def on(text_data, **changes) -> RunOptions:
    """A run of tiny-llama on the test's dataset, as `anatomy run --dataset … --tokenizer …`."""
    options = RunOptions(model="tiny-llama", batch_size=4, max_steps=2,
                         dataset=str(text_data.dataset), tokenizer=str(text_data.tokenizer))
    return replace(options, **changes)


def _refused(options: RunOptions) -> tuple[str, str]:
    (field, message), = validate(options, gpu_count=0).items()
    assert "\n" not in message and message.startswith(field + ": ")
    return field, message


def test_a_saved_dataset_with_a_split_gone_is_refused_not_read_as_its_other_files(
        text_data, tmp_path):
    """A DatasetDict folder whose train split was removed was read as a folder of arrow files:
    its test split, trained on as the whole."""
    splits = tmp_path / "splits"
    shutil.copytree(text_data.splits, splits)
    shutil.rmtree(splits / "train")
    field, message = _refused(on(text_data, dataset=str(splits)))
    assert field == "dataset"
    assert message.startswith(f"dataset: {str(splits)!r}, saved with save_to_disk, cannot be "
                              "read: ")
