"""The operation classes: the table, its fallbacks, and a real profiled training step in this process."""

from __future__ import annotations

import json

import pytest
import torch

from anatomy.analysis.models import build_model
from anatomy.analysis.operations import (
    CLASSES,
    CONTRACTION,
    ELEMENTWISE,
    NORMALIZATION,
    OPERATOR_CLASSES,
    OTHER,
    PAPER_CITATION,
    PAPER_SHARES,
    OperationProfile,
    classify,
    comparison,
)
from anatomy.engine.profiler import profile_steps

TABLE = {
    CONTRACTION: ["mm", "addmm", "bmm", "baddbmm", "matmul", "linear",
                  "scaled_dot_product_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_flash_attention_backward", "_efficient_attention_forward",
                  "_scaled_dot_product_attention_math"],
    NORMALIZATION: ["softmax", "_softmax", "_safe_softmax", "_softmax_backward_data", "layer_norm",
                    "native_layer_norm", "native_layer_norm_backward", "_log_softmax",
                    "nll_loss_forward", "nll_loss_backward", "sum", "mean", "linalg_vector_norm",
                    "_foreach_norm"],
    ELEMENTWISE: ["add", "add_", "mul", "mul_", "div", "div_", "gelu", "gelu_backward", "dropout",
                  "native_dropout", "native_dropout_backward", "bernoulli_", "tanh",
                  "tanh_backward", "addcmul_", "addcdiv_", "sqrt", "lerp_", "_foreach_add_",
                  "_foreach_addcdiv_", "_fused_adamw_"],
    OTHER: ["copy_", "to", "_to_copy", "view", "reshape", "t", "transpose", "empty", "zeros",
            "fill_", "embedding", "embedding_dense_backward", "index_select", "normal_"],
}


@pytest.mark.parametrize("kind, name", [(k, n) for k, names in TABLE.items() for n in names])
def test_classify_table(kind, name):
    assert classify(f"aten::{name}") == kind


@pytest.mark.parametrize("name, kind", [
    ("aten::_scaled_dot_product_some_new_attention", CONTRACTION),  # by pattern
    ("aten::_fused_rms_norm_backward", NORMALIZATION),
    ("aten::_foreach_pow_", ELEMENTWISE),
    ("aten::feature_alpha_dropout", ELEMENTWISE),
    ("aten::normal_", OTHER),  # not a normalization
    ("aten::something_unheard_of", OTHER),
    ("AddmmBackward0", OTHER),  # an autograd node, not an operator
    ("Optimizer.step#AdamW.step", OTHER),
])
def test_classify_fallbacks(name, kind):
    assert classify(name) == kind


def test_every_table_entry_is_a_class():
    assert set(OPERATOR_CLASSES.values()) == set(CLASSES)
    assert all(name.startswith("aten::") for name in OPERATOR_CLASSES)


def test_paper_shares_are_whole_and_cited():
    for measure in ("flop", "runtime"):
        assert sum(PAPER_SHARES[k][measure] for k in PAPER_SHARES) == pytest.approx(1.0)
    assert "arXiv:2007.00072" in PAPER_CITATION


@pytest.fixture(scope="module")
def profiled():
    """One real training step of the tiny preset on the CPU: forward, backward, optimizer step."""
    torch.manual_seed(0)
    model, _ = build_model("tiny")
    batch = {"input_ids": torch.randint(100, 30000, (2, 32)), "labels": torch.tensor([0, 1])}
    return profile_steps(model, batch, steps=1, device="cpu")


def test_profiled_step_puts_operators_in_their_classes(profiled):
    seen = {op["name"]: op["class"] for op in profiled.operators}
    for name in ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul"):
        assert seen[name] == CONTRACTION, name
    for name in ("aten::native_layer_norm", "aten::native_layer_norm_backward",
                 "aten::_softmax_backward_data"):
        assert seen[name] == NORMALIZATION, name
    assert any("softmax" in name and kind == NORMALIZATION for name, kind in seen.items())
    for name in ("aten::gelu", "aten::gelu_backward", "aten::dropout", "aten::add"):
        assert seen[name] == ELEMENTWISE, name
    for kind in (CONTRACTION, NORMALIZATION, ELEMENTWISE):
        assert profiled.classes[kind].time_us > 0 and profiled.classes[kind].count > 0


def test_profiled_shares_sum_to_one_and_contractions_hold_the_flops(profiled):
    assert sum(profiled.time_shares().values()) == pytest.approx(1.0)
    assert sum(profiled.flop_shares().values()) == pytest.approx(1.0)
    assert profiled.flop_shares()[CONTRACTION] > 0.9
    assert profiled.flop_shares()[OTHER] == 0
    assert profiled.optimizer.time_us > 0 and profiled.optimizer.count > 0  # kept apart
    assert profiled.time_source == "CPU self time" and profiled.device == "cpu"
    times = [op["time_us"] for op in profiled.top(5)]
    assert times == sorted(times, reverse=True)


def test_profile_round_trips_through_json(profiled):
    again = OperationProfile.from_dict(json.loads(json.dumps(profiled.to_dict())))
    assert again == profiled
    rows = comparison(again)
    assert [row.kind for row in rows] == list(CLASSES)
    assert rows[0].paper_time_share == PAPER_SHARES[CONTRACTION]["runtime"]


