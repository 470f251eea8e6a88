"""The measured components' arithmetic: the rest of the peak, and what only NVML's samples know."""

from __future__ import annotations

from anatomy.analysis.components import Components, rest_of_peak, with_nvml

MIB = 2**20
PARTS = {"weights": 1000 * MIB, "gradients": 1000 * MIB, "optimizer_states": 2000 * MIB}


def test_rest_of_peak_at_the_start_of_the_backward_pass():
    parts = {**PARTS, "activations": 3000 * MIB}  # activations outweigh the gradients
    assert rest_of_peak(**parts, peak=6100 * MIB) == 100 * MIB


def test_rest_of_peak_at_the_optimizer_step():
    parts = {**PARTS, "activations": 200 * MIB}  # checkpointing: gradients outweigh activations
    assert rest_of_peak(**parts, peak=5300 * MIB) == 1300 * MIB


def test_with_nvml_adds_context_non_torch_and_peak():
    memory = {"baseline": 0, "kernel": 500 * MIB}
    measured = Components(**PARTS, activations=3000 * MIB, peak_allocated=6100 * MIB,
                          peak_reserved=6700 * MIB)
    out = with_nvml(measured, memory, peak=7400 * MIB, backend="nvml")
    assert out.context == 500 * MIB
    assert out.non_torch == 200 * MIB  # 7400 - 500 context - 6700 reserved
    assert out.temporary == 100 * MIB
    assert out.peak == 7400 * MIB


def test_cpu_runs_get_no_context():
    memory = {"baseline": 100 * MIB, "kernel": 300 * MIB}
    out = with_nvml(Components(**PARTS), memory, peak=600 * MIB, backend="cpu-rss")
    assert out.context is None and out.temporary is None
    assert "context" not in out.to_dict() and "temporary" not in out.to_dict()
    assert out.peak == 500 * MIB  # RSS above the baseline


def test_a_run_that_never_had_a_full_micro_batch_says_so_in_show(store, seed, capsys):
    """A Trainer whose data held fewer samples than its batch size: its activations are a
    smaller micro-batch's than the prediction's, and `show` listed them without a word."""
    from anatomy.cli import main

    run_id = seed(backend="cpu-rss")  # batch size 4
    summary = store.run(run_id).summary.to_dict()
    for samples, said in ((3, True), (4, False), (None, False)):  # None: a run stored before
        store.update_run(run_id, summary={**summary, "components": {
            "weights": 100, "activations": 30, **({"micro_batch": samples} if samples else {})}})
        assert main(["show", str(run_id), "--store", str(store.path)]) == 0
        out = capsys.readouterr().out
        assert ("This run never had a full micro-batch of 4 samples (its data held fewer): its "
                "activations were measured on a micro-batch of 3, and the prediction is for 4."
                in out.splitlines()) == said
