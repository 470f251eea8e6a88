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


def _texts_model():
    import torch

    class Texts(torch.nn.Module):
        """Token ids in, a loss out: what it saves for the backward pass grows with the batch."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 4)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return (self.embed(input_ids) * attention_mask[..., None]).square().sum()

    return Texts().train()


def _padded(*lengths: int) -> dict:
    """A micro-batch as DataCollatorWithPadding makes it: padded to its longest text, right."""
    import torch

    mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
    return {"input_ids": mask.clone(), "attention_mask": mask, "labels": mask.clone()}


def test_the_probe_says_which_padded_micro_batch_it_measured():
    """Padded to each batch's own longest text, a dataset's batches differ step by step: the
    probe keeps, with the latest full micro-batch's activations, its shape (the length it was
    padded to, and each text's tokens where it held padding), which a reader predicts."""
    from anatomy.engine.probe import ComponentProbe

    model = _texts_model()
    probe = ComponentProbe(model, use_cuda=False, batch_size=2)
    model(**_padded(3, 9)).backward()
    measured = probe.result()
    assert (measured.micro_batch, measured.padded_to, measured.sequence_lengths) == (2, 9, (9, 3))
    model(**_padded(5, 5)).backward()  # all as long as the batch: no padding to say
    model(**_padded(11)).backward()  # an epoch's partial last micro-batch: not the step measured
    probe.close()
    measured = probe.result()
    assert (measured.micro_batch, measured.padded_to, measured.sequence_lengths) == (2, 5, None)
    stored = Components.from_dict({**measured.to_dict(), "sequence_lengths": [9, 3]})
    assert stored.sequence_lengths == (9, 3)


def test_a_gpu_runs_peaks_are_its_steps_of_the_measured_batchs_shape():
    """On a GPU the allocator's peaks are read step by step: those of the steps that trained the
    measured micro-batch's shape describe it; every step where the batches all had one shape."""
    from anatomy.engine.probe import BatchShape, StepPeaks, alike_steps

    long, short = BatchShape(2, 9, (9, 3)), BatchShape(2, 5)
    steps = [StepPeaks((long,), 900, 1024), StepPeaks((short,), 500, 1024),
             StepPeaks((short, long), 900, 1024)]
    assert alike_steps(steps, short) == [steps[1]]
    assert alike_steps(steps[:1], short) == steps[:1]  # none alike: every step, as before
    assert alike_steps([StepPeaks((short,), 500, 1024)] * 3, short) == [steps[1]] * 3
    # An evaluation between steps (a user's eval_strategy): its batches' peak, and the cache it
    # left reserved, are no training step's; every step if none came before it.
    evaluated = [StepPeaks((short,), 500, 1024), StepPeaks((short,), 2900, 4096, None, None, True)]
    assert alike_steps(evaluated, short) == evaluated[:1]
    assert alike_steps(evaluated[1:], short) == evaluated[1:]


def test_a_measured_batch_is_the_prediction_s_text_batch():
    from anatomy.analysis.components import measured_batch
    from anatomy.analysis.lengths import TextBatch
    from anatomy.store import TrainingData

    data = TrainingData(dataset="/d", padding="longest", inputs=("attention_mask",),
                        padding_side="left", lengths=((3, 1), (9, 1)))
    assert measured_batch(Components(micro_batch=2, padded_to=9, sequence_lengths=(9, 3)),
                          data) == TextBatch((9, 3), 9, ("attention_mask",), "left")
    assert measured_batch(Components(micro_batch=2, padded_to=5), data) == \
        TextBatch((5, 5), 5, ("attention_mask",), "left")
    # a run stored before the probe said which: none (it is predicted at its longest batch)
    assert measured_batch(Components(micro_batch=2), data) is None
    assert measured_batch(Components(micro_batch=2, padded_to=5), None) is None
