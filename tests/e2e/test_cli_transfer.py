"""`anatomy export` and `anatomy import` as a subprocess: the new ids, a bad file on stderr, copies."""

from __future__ import annotations

import subprocess
import sys

from anatomy.cli import main
from tests.conftest import contents, exported


def test_the_cli_exports_several_runs_and_import_prints_the_new_ids(source, target, tmp_path):
    store, ids = source
    path = tmp_path / "runs.json"
    assert main(["export", *map(str, ids[:2]), "--format", "json", "--output", str(path),
                 "--store", str(store.path)]) == 0
    result = subprocess.run([sys.executable, "-m", "anatomy", "import", str(path),
                             "--store", str(target.path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    new_ids = [int(line) for line in result.stdout.split()]
    assert len(new_ids) == 2 and [target.run(i).status for i in new_ids] == ["completed", "oom"]


def test_the_cli_refuses_a_bad_file_on_stderr_and_imports_nothing(source, target, tmp_path):
    store, ids = source
    path = tmp_path / "cut.json"
    path.write_text(exported(store, ids)[:5000])
    before = contents(target)
    result = subprocess.run([sys.executable, "-m", "anatomy", "import", str(path),
                             "--store", str(target.path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert "refused, nothing was imported: the file is truncated" in result.stderr
    assert contents(target) == before


def test_the_cli_refuses_a_second_import_and_imports_copies_when_asked(source, target, tmp_path):
    store, ids = source
    path = tmp_path / "runs.json"
    path.write_text(exported(store, ids[:1]))
    args = [sys.executable, "-m", "anatomy", "import", str(path), "--store", str(target.path)]
    assert subprocess.run(args, capture_output=True, text=True, timeout=60).returncode == 0
    again = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.startswith(f"error: {path}: runs[0] (run {ids[0]} of {store.path}")
    assert again.stderr.rstrip().endswith("already imported as run 2; nothing was imported"
                                          " (--copy imports it again)")
    copied = subprocess.run(args + ["--copy"], capture_output=True, text=True, timeout=60)
    assert copied.returncode == 0 and copied.stdout.split() == ["3"]
