"""The model a run carries (analysis/carried_model.py): what each front keeps of it, and every
reader — the prediction, `show`, an export imported elsewhere — reading that copy rather than a
path that named the model where the run started. The Anatomy page's side is
test_anatomy_page.py's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from anatomy import cli
from anatomy.analysis import carried_model, models, transfer
from anatomy.analysis.report import report
from anatomy.prediction import Prediction, breakdown
from tests.conftest import USERS_MODEL


def test_a_config_file_named_relatively_is_kept_as_read_with_its_absolute_path(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps(USERS_MODEL))
    facts = carried_model.kept(models.resolve("mine.json"))
    assert (facts.model, facts.model_source) == ("mine", "config file")
    assert facts.model_path == str(tmp_path / "mine.json")
    assert facts.model_config == USERS_MODEL


def test_a_preset_is_kept_by_its_name_alone():
    facts = carried_model.kept(models.resolve("tiny"))
    assert (facts.model, facts.model_source, facts.model_config, facts.model_path) == \
        ("tiny", "preset", None, None)


def test_a_trainers_model_from_a_folder_keeps_its_config_and_the_folder(tmp_path, monkeypatch):
    """The callback's side: the config as transformers writes it, the head as its architecture,
    and the folder `from_pretrained` read (named relatively by the script) made absolute."""
    from transformers import BertConfig, BertForSequenceClassification

    monkeypatch.chdir(tmp_path)
    BertForSequenceClassification(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=1000)).save_pretrained("my-bert")
    model = BertForSequenceClassification.from_pretrained("my-bert")
    facts = carried_model.trained(model.config, type(model).__name__)
    assert (facts.model_class, facts.model_name) == ("BertForSequenceClassification", "my-bert")
    assert facts.model_path == str(tmp_path / "my-bert")
    assert facts.model_config["architectures"] == ["BertForSequenceClassification"]
    assert facts.model_config["hidden_size"] == 64


def test_show_names_where_the_model_came_from(store, model_gone, tmp_path, capsys):
    run_id = model_gone()
    assert cli.main(["show", str(run_id), "--store", str(store.path)]) == 0
    assert (f"model: my-bert from model folder {tmp_path / 'project' / 'my-bert'} (its config "
            "kept in the run)") in capsys.readouterr().out.splitlines()


def test_an_exported_run_imported_elsewhere_is_predicted_from_the_config_it_kept(
        store, model_gone, target):
    """The run's file stayed on the machine it was exported from (here: deleted): the import
    predicts it as the run did where it started."""
    run_id = model_gone()
    here = breakdown.predicted(report(store, run_id))
    (imported,) = transfer.import_runs(target, json.dumps(transfer.export_runs(store, [run_id])))
    there = breakdown.predicted(report(target, imported))
    assert isinstance(there, Prediction), there
    assert there == here
    # BertForSequenceClassification of the folder's config (hidden 64, 2 layers, 1000 tokens)
    assert there.parameters == 139_586


def _trained_run(store, config, class_name: str, media: tuple[str, ...] | None) -> int:
    """A CPU run of a user's Trainer (the callback's facts of its model), its batches holding
    `media` besides their text where given, as the callback's forward hook saw them."""
    from anatomy.analysis.options import RunOptions
    from anatomy.store import RunFacts
    from tests.conftest import seed_run

    run_id = seed_run(store, backend="cpu-rss")
    store.update_run(run_id, options=RunOptions(model=class_name, batch_size=2,
                                                seq_len=32).to_dict())
    store.merge_environment(run_id, carried_model.trained(config, class_name))
    if media:
        store.merge_environment(run_id, RunFacts(media_inputs=media))
    return run_id


def test_a_vision_language_model_trained_with_its_images_has_no_text_alone_prediction(store):
    """anatomy predicts a vision-language model on its text: a user's Trainer that fed it images
    (the callback saw pixel_values) would have been shown a prediction without its vision
    tower's activations, gradients and states. Trained on text alone, it is predicted; an image
    classifier fed pixel_values is predicted with them."""
    from transformers import LlavaConfig, ViTConfig

    tower = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    llava = LlavaConfig(text_config=dict(model_type="llama", vocab_size=1000, **tower),
                        vision_config=dict(model_type="clip_vision_model", image_size=32,
                                           patch_size=8, **tower), image_token_index=900)
    with_images = breakdown.predicted(report(store, _trained_run(
        store, llava, "LlavaForConditionalGeneration", ("pixel_values",))))
    assert with_images == breakdown.NoPrediction(
        "its batches held pixel_values, and anatomy predicts this model on its text alone (its "
        "vision or audio tower's activations, gradients and optimizer states would be left out)")
    text_alone = breakdown.predicted(report(store, _trained_run(
        store, llava, "LlavaForConditionalGeneration", None)))
    assert isinstance(text_alone, Prediction), text_alone
    vit = ViTConfig(image_size=32, patch_size=8, **tower)
    images = breakdown.predicted(report(store, _trained_run(
        store, vit, "ViTForImageClassification", ("pixel_values",))))
    assert isinstance(images, Prediction), images


def test_the_callback_tells_the_inputs_that_are_no_text_as_they_first_come():
    import torch

    from anatomy.engine.callbacks import BatchLengths

    class Model(torch.nn.Module):
        def forward(self, input_ids=None, pixel_values=None, input_features=None):
            return input_ids

    told: list[tuple[str, ...]] = []
    model = Model()
    lengths = BatchLengths(model, told.append)
    model(input_ids=torch.zeros(2, 7))
    model(input_ids=torch.zeros(2, 5), pixel_values=torch.zeros(2, 3, 4, 4))
    model(input_ids=torch.zeros(2, 9), pixel_values=torch.zeros(2, 3, 4, 4))
    model.eval()
    model(input_ids=torch.zeros(2, 9), input_features=torch.zeros(2, 3))  # an evaluation's
    assert told == [("pixel_values",)] and lengths.media == ("pixel_values",)
    assert lengths.take() == 9


def _users_lora_run(store, tmp_path, **lora) -> int:
    """A CPU run of a user's Trainer over a peft LoRA model of tiny-llama's config, stored as the
    callback's facts of it are (its options: the Trainer's arguments and the adapters')."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import TrainingArguments

    from anatomy.engine import callbacks
    from tests.conftest import seed_run

    spec = models.resolve("tiny-llama")
    plain, _ = models.build_model(spec, "meta", pretrained=False)
    model = get_peft_model(plain, LoraConfig(task_type=TaskType.CAUSAL_LM, **lora))
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                  per_device_train_batch_size=2)
    facts = callbacks._training_facts(arguments, model, False)
    run_id = seed_run(store, backend="cpu-rss")
    options = {**facts.training_arguments.to_dict(), "seq_len": 32}
    store.update_run(run_id, options=options, preset=facts.model_name or "LlamaForCausalLM")
    store.merge_environment(run_id, facts)
    return run_id


def test_a_users_lora_dropout_is_predicted_and_what_lora_is_not_is_said(store, tmp_path):
    """peft's lora_dropout (0.05 in most users' LoraConfig) was not recorded: the prediction
    was LoRA's without it, short of each adapted layer's dropped-out input and mask. It is
    recorded and predicted, as `predict --lora-dropout` does; adapters that are more than a
    LoRA of one rank (DoRA, trained biases, a full copy of the output layer, another kind of
    adapter) have no prediction, and the words say what is left out."""
    from peft import LoHaConfig, TaskType, get_peft_model

    from anatomy.analysis.options import RunOptions
    from anatomy.engine import callbacks
    from anatomy.prediction import Request, answer, ran_on

    targets = dict(r=4, target_modules=["q_proj", "v_proj"])
    dropped = report(store, _users_lora_run(store, tmp_path, lora_dropout=0.05, **targets))
    assert dropped.options.lora_dropout == 0.05
    with_dropout = breakdown.predicted(dropped)
    assert isinstance(with_dropout, Prediction), with_dropout
    asked = RunOptions(model=dropped.options.model, batch_size=2, seq_len=32, lora_rank=4,
                       lora_targets=("q_proj", "v_proj"), lora_dropout=0.05)
    with breakdown._own_options(dropped) as own:  # the model the run kept, as the page builds it
        direct = answer(Request(replace(asked, model=own.model), ran_on(dropped))).alone
    assert with_dropout.activations == direct.activations
    plain = breakdown.predicted(report(store, _users_lora_run(store, tmp_path, **targets)))
    assert with_dropout.activations > plain.activations

    for lora, words in [
        (dict(use_dora=True), "use_dora=True"),
        (dict(bias="all", lora_dropout=0.1), "bias='all'"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save=['lm_head']")]:
        said = breakdown.predicted(report(store, _users_lora_run(store, tmp_path, **targets,
                                                                 **lora)))
        assert said == breakdown.NoPrediction(
            f"it trained with what anatomy does not predict ({words})"), said
    base, _ = models.build_model(models.resolve("tiny-llama"), "meta", pretrained=False)
    loha = get_peft_model(base, LoHaConfig(r=4, target_modules=["q_proj"],
                                           task_type=TaskType.CAUSAL_LM))
    assert callbacks._adapter_left_out(loha) == ["peft_type=LOHA"]


def test_a_classifiers_head_saved_whole_is_what_the_prediction_trains_too():
    """peft's image classification guide saves the head whole (modules_to_save=["classifier"]),
    as the prediction's LoRA does for a classifier: nothing is left out. A layer of the backbone
    saved whole (a BERT's pooler) or a causal LM's output layer is a copy the prediction does
    not make."""
    from peft import LoraConfig, get_peft_model
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        ViTConfig,
        ViTForImageClassification,
    )

    from anatomy.engine import callbacks

    tower = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    vit = get_peft_model(ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, **tower)),
                         LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                    modules_to_save=["classifier"]))
    assert callbacks._adapter_left_out(vit) == []
    bert = get_peft_model(BertForSequenceClassification(BertConfig(vocab_size=100, **tower)),
                          LoraConfig(r=4, target_modules=["query", "value"],
                                     modules_to_save=["classifier", "pooler"]))
    assert callbacks._adapter_left_out(bert) == ["modules_to_save=['classifier', 'pooler']"]


@pytest.mark.parametrize("reported, words", [
    ({"optim": "paged_adamw_8bit"}, "optim: 'paged_adamw_8bit' is not one of adamw_torch, "
     "adamw_torch_fused, adafactor, sgd, adagrad, rmsprop"),
    ({"optim": "adamw_torch", "batch_size": 5000}, "batch_size: 5000 is out of range: 1 to 4096"),
    ({"optim": "sgd"}, None),
    ({"optim": "adafactor", "epochs": 3.0, "seed": 7}, None)])
def test_a_users_training_with_what_anatomy_does_not_run_is_not_predicted_as_a_default(
        store, reported, words):
    """A user's Trainer with optim="paged_adamw_8bit" (QLoRA's recipes) was predicted as
    adamw_torch — 32-bit states for 8-bit ones, without a word — for a value anatomy's own runs
    do not take is read as its default. The prediction says what it does not predict instead;
    what it runs is predicted, whatever else the Trainer said (its epochs, its seed)."""
    from transformers import LlamaConfig

    run_id = store.create_run({"batch_size": 2, "seq_len": 32, "precision": "fp32", **reported},
                              "cpu-rss", "rss", 0, {"gpu_name": None}, preset="train.py",
                              source={"kind": "script", "script": "/home/user/train.py"})
    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    store.merge_environment(run_id, carried_model.trained(config, "LlamaForCausalLM"))
    said = breakdown.predicted(report(store, run_id))
    if words is None:
        assert isinstance(said, Prediction), said
    else:
        assert said == breakdown.NoPrediction(
            f"it trained with what anatomy does not predict ({words})")


@pytest.mark.parametrize("arguments, weights, words", [
    ({}, "float16", "weights in float16, not float32 or bfloat16"),
    ({"bf16": True}, "bfloat16", None),
    ({"label_smoothing_factor": 0.1}, "float32", None),
    ({"neftune_noise_alpha": 5.0}, "float32", "neftune_noise_alpha=5.0"),
    ({"bf16": True}, "float32", None)])
def test_a_users_trainer_that_does_what_the_prediction_does_not_is_said(
        store, tmp_path, arguments, weights, words):
    """A model loaded in bf16 was predicted with fp32 weights (seen on a user's Trainer: 3.2 MB
    of weights predicted for 1.6 MB measured, twice the gradients and states): the callback
    records the weights' type, and bf16 ones are predicted as held; fp16 ones, which the
    prediction does not build, and NEFTune's noise are said instead of predicted as if not
    there. The Trainer's label smoothing (its own loss on the logits: activations predicted
    10.4 MB for 7.3 MB as if it were not there) is recorded, and predicted with it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from anatomy.engine import callbacks

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    model = LlamaForCausalLM(config).to(getattr(torch, weights))
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=2, **arguments)
    facts = callbacks._training_facts(training, model, False)
    rep = _stored_user_run(store, facts)
    said = breakdown.predicted(rep)
    if words is None:
        assert isinstance(said, Prediction), said
        assert rep.options.weights == {"float32": "fp32", "bfloat16": "bf16"}[weights]
        # the Trainer's smoother is recorded and predicted (refused before: its own loss)
        assert rep.options.label_smoothing == arguments.get("label_smoothing_factor", 0)
        bytes_per_weight = {"float32": 4, "bfloat16": 2}[weights]
        assert said.weights == bytes_per_weight * sum(p.numel() for p in model.parameters())
    else:
        assert said == breakdown.NoPrediction(
            f"it trained with what anatomy does not predict ({words})")


def _optimizers(model):
    """The optimizers a script gives its Trainer (optimizers=(…)), by what it builds."""
    import torch
    from transformers.optimization import Adafactor

    every = list(model.parameters())
    return {
        "AdamW": torch.optim.AdamW(every, lr=1e-3),
        "SGD": torch.optim.SGD(every, lr=0.1),
        "SGD with momentum": torch.optim.SGD(every, lr=0.1, momentum=0.9),
        "Adafactor": Adafactor(every, lr=1e-3, relative_step=False, scale_parameter=False),
        "AdamW over the first layer": torch.optim.AdamW(every[:1], lr=1e-3),
        "frozen embeddings": None,
        "AdamW over a LoRA model's every parameter": torch.optim.AdamW(every, lr=1e-3),
        "a library's own": _Stepper(),
    }


class _Stepper:
    """An optimizer of a library's own: a step, no torch defaults nor parameter groups."""

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


@pytest.mark.parametrize("given, optim, words", [
    ("AdamW", "adamw_torch", None),
    ("SGD", "sgd", None),
    ("AdamW over a LoRA model's every parameter", "adamw_torch", None),
    ("Adafactor", "adafactor", None),
    ("a library's own", None,
     "it trained with what anatomy does not predict (its own optimizer, _Stepper)"),
    ("SGD with momentum", None,
     "it trained with what anatomy does not predict (its own optimizer, SGD(momentum=0.9))"),
    ("AdamW over the first layer", None,
     "it trained with what anatomy does not predict (its own optimizer over 3,200 of 16,736 "
     "trainable parameters)"),
    ("frozen embeddings", None, None),
    ("frozen in more pieces than a run records", None,
     "it trained 13,504 of its 16,736 parameters, and anatomy predicts 16,736 trained "
     "(which parameters the script froze or trained itself, by requires_grad, was not "
     "recorded)")])
def test_a_scripts_own_optimizer_and_frozen_parameters_are_predicted_or_said(
        store, tmp_path, monkeypatch, given, optim, words):
    """A script's own optimizer (`Trainer(optimizers=(SGD(…, momentum=0.9), None))`) was
    predicted as the Trainer's optim argument said, AdamW's two states where SGD's momentum
    holds one (6.5 MB predicted for 3.2 MB on a 2-layer Llama), and parameters the script froze
    itself (its embeddings) were predicted trained (gradients 3.2 MB for 2.2 MB), without a
    word. An optimizer the Trainer builds alike is predicted as its optim name, parameters
    frozen as they were; another optimizer, or one over part of the trainable parameters, and a
    model frozen in more pieces than a run records are said instead (`optim` None: the
    arguments' stands)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from anatomy.engine import callbacks

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    model = LlamaForCausalLM(config)
    optimizer = _optimizers(model).get(given)
    if given.startswith("frozen"):
        model.model.embed_tokens.weight.requires_grad_(False)
    if given == "frozen in more pieces than a run records":
        model.model.norm.weight.requires_grad_(False)
        monkeypatch.setattr(models, "MAX_FROZEN_NAMES", 1)
    if "LoRA" in given:  # its adapters made after: given to it as the script gives them
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=2)
    facts = callbacks._training_facts(training, model, False, optimizer=optimizer)
    # the Trainer's optim argument where the script's optimizer is not one it builds
    assert facts.training_arguments.optim == (optim or training.optim.value)
    said = breakdown.predicted(_stored_user_run(store, facts))
    if words is None:
        assert isinstance(said, Prediction), said
        assert said.trainable_parameters == facts.trainable_parameters  # frozen as it was
    else:
        assert said == breakdown.NoPrediction(words)


def test_a_users_eager_attention_is_recorded_and_predicted(store, tmp_path):
    """A user's model built with eager attention (`attn_implementation="eager"`) was predicted
    with sdpa's activations (10.4 MB for a 2-layer Llama that held 12.0 MB): the callback
    records eager attention, and the prediction builds it (more activations: its attention
    weights); sdpa, transformers' own choice, is recorded as nothing (stored as before)."""
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from anatomy.engine import callbacks
    from anatomy.vocabulary import Attention

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=2)
    activations = {}
    for attention in ("sdpa", "eager"):
        model = LlamaForCausalLM._from_config(config, attn_implementation=attention)
        facts = callbacks._training_facts(training, model, False)
        assert ("attention" in facts.training_arguments.to_dict()) is (attention == "eager")
        rep = _stored_user_run(store, facts)
        assert rep.options.attention == Attention(attention)
        said = breakdown.predicted(rep)
        assert isinstance(said, Prediction), said
        activations[attention] = said.activations
    assert activations["eager"] > activations["sdpa"]


@pytest.mark.parametrize("compiled", ["torch.compile", "model.compile", "under LoRA", None])
def test_a_model_the_script_compiled_is_said(tmp_path, compiled):
    """A model the script compiled itself (`torch.compile(model)`, `model.compile()`) was
    predicted as the eager step: 10.4 MB of activations for a 2-layer Llama whose compiled
    graph held 9.1 MB, without a word. It is said instead; an eager model is predicted."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from anatomy.engine import callbacks

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=100)
    model = LlamaForCausalLM(config)
    if compiled == "torch.compile":
        model = torch.compile(model)  # lazy: nothing compiles until it runs
    elif compiled is not None:
        model.compile()
    if compiled == "under LoRA":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    facts = callbacks._training_facts(training, model, False)
    assert facts.left_out == (("torch.compile(model)",) if compiled else None)


def test_a_speech_encoder_frozen_as_transformers_freezes_it_is_predicted_and_by_a_loop_said(
        store, tmp_path):
    """A speech model's feature encoder frozen with transformers' `freeze_feature_encoder()`
    (wav2vec2's recipes) also stops asking its input's gradient, so autograd keeps none of its
    convolutions' activations: recorded by name and built so by the prediction (`_requires_grad`
    off as the method leaves it). Frozen by requires_grad alone, the encoder still asks it (on a
    small wav2vec2 classifier: 43.3 MB of activations, 39.7 MB with the method): said, not
    predicted as the method."""
    from transformers import TrainingArguments

    from anatomy.engine import callbacks
    from bench.architectures import architectures, working_config

    kind = "speech-encoder-decoder"
    spec = models.resolve(str(working_config(kind, dict(architectures())[kind], tmp_path)[0]))
    by_method, _ = models.build_model(spec, "cpu", pretrained=False)
    by_method.freeze_feature_encoder()
    names = models.frozen_names(by_method)
    assert names == ("encoder.feature_extractor",)
    built, _ = models.build_model(spec, "cpu", pretrained=False, frozen=names)
    assert [(n, p.requires_grad) for n, p in built.named_parameters()] == \
        [(n, p.requires_grad) for n, p in by_method.named_parameters()]
    assert built.encoder.feature_extractor._requires_grad is False
    by_loop, _ = models.build_model(spec, "cpu", pretrained=False)
    for parameter in by_loop.encoder.feature_extractor.parameters():
        parameter.requires_grad_(False)
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    method_facts = callbacks._training_facts(training, by_method, False)
    assert method_facts.training_arguments.frozen == "encoder.feature_extractor"
    assert not method_facts.left_out
    loop_facts = callbacks._training_facts(training, by_loop, False)
    assert loop_facts.left_out == (
        "encoder.feature_extractor frozen by requires_grad alone, not freeze_feature_encoder() "
        "(its input still asks a gradient)",)


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining",
                                  "BertForSequenceClassification"])
def test_a_users_masked_lm_is_predicted_as_one_and_a_pretraining_head_said(store, tmp_path,
                                                                           head):
    """A user's Trainer of a masked-LM head (BertForMaskedLM on its masked tokens) was predicted
    as the sequence classifier anatomy trains of a config that names one (the walkthrough's
    BERT): 4.8 MB of activations for 9.7 MB held, without a word. A masked-LM head is predicted
    as one (its vocabulary-wide output); a pre-training head is said; a task's head is
    predicted."""
    import transformers
    from transformers import BertConfig, TrainingArguments

    from anatomy.engine import callbacks

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, vocab_size=100)
    model = getattr(transformers, head)(config)
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=2)
    facts = callbacks._training_facts(training, model, False)
    said = breakdown.predicted(_stored_user_run(store, facts))
    if head != "BertForPreTraining":
        assert isinstance(said, Prediction), said
        assert said.weights == 4 * sum(p.numel() for p in model.parameters())
    else:
        assert said == breakdown.NoPrediction(
            f"it trained {head}, a head anatomy does not train (it would predict the model as "
            "sequence classification)")


@pytest.mark.parametrize("trained", ["a classifier of a causal LM's checkpoint",
                                     "a subclass of the script's own"])
def test_the_head_a_user_trained_is_the_one_predicted_whatever_its_config_names(
        store, tmp_path, trained):
    """A classifier loaded from a causal LM's checkpoint
    (`AutoModelForSequenceClassification.from_pretrained` of a Llama: its config still names
    LlamaForCausalLM) was predicted as the causal LM, a vocabulary-wide output it does not
    have: 1.9 MB of weights for 1.1 MB held. The callback records the class trained as the
    config's architecture, as save_pretrained writes it; a script's own subclass by
    transformers' class it derives from."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
        TrainingArguments,
    )

    from anatomy.engine import callbacks

    class MyLlama(LlamaForCausalLM):
        pass

    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, vocab_size=500, pad_token_id=0, num_labels=3)
    config.architectures = ["LlamaForCausalLM"]  # as the checkpoint's config says
    model = (LlamaForSequenceClassification if trained.startswith("a classifier")
             else MyLlama)(config)
    training = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 per_device_train_batch_size=2)
    facts = callbacks._training_facts(training, model, False)
    said = breakdown.predicted(_stored_user_run(store, facts))
    assert isinstance(said, Prediction), said
    assert said.weights == 4 * sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("trained", "config_names"), [
    ("LlamaForSequenceClassification", "LlamaForCausalLM"),
    ("BertForMaskedLM", "BertForMaskedLM"),
    ("BertForSequenceClassification", "BertForMaskedLM")])
def test_a_run_stored_with_its_checkpoints_architecture_is_predicted_as_it_trained(
        store, trained, config_names):
    """A user's run stored before the callback wrote the class trained as the architecture
    keeps its checkpoint's (a classifier of a causal LM's: LlamaForCausalLM) beside the class it
    recorded: predicted as the class trained (its weights, not the checkpoint head's)."""
    import transformers
    from transformers import AutoConfig

    from anatomy.store import RunFacts
    from anatomy.store import TrainingArguments as Reported

    config = AutoConfig.for_model(
        "llama" if trained.startswith("Llama") else "bert", hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, vocab_size=500, pad_token_id=0)
    config.architectures = [config_names]
    model = getattr(transformers, trained)(config)
    facts = RunFacts.of(training_arguments=Reported.of(batch_size=2), parameters=sum(
        p.numel() for p in model.parameters())).merged(
        carried_model.trained(config, trained))  # as the callback stored it before
    assert facts.model_config["architectures"] == [config_names]
    said = breakdown.predicted(_stored_user_run(store, facts))
    assert isinstance(said, Prediction), said
    assert said.weights == 4 * facts.parameters


def _stored_user_run(store, facts):
    """A user's training stored as the callback stores it (its reported options at sequence
    length 32, then its facts), read back as a report."""
    run_id = store.create_run({**facts.training_arguments.to_dict(), "seq_len": 32}, "cpu-rss",
                              "rss", 0, {"gpu_name": None}, preset="train.py",
                              source={"kind": "script", "script": "/home/user/train.py"})
    store.merge_environment(run_id, facts)
    return report(store, run_id)
