"""benchmarks/model_step.py's parts on a tiny decoder: the model, the timing's statistics, the profile,
the lookups' count and the goals' verdicts (the benchmark itself runs for minutes: never here)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import tiletune.nn
from benchmarks.model.costs import lookup_cost, operator_shares
from benchmarks.model.decoder import DecoderShape, build_decoder, next_token_loss
from benchmarks.model.steps import STEPS, Variant, measure, on_operators, spread
from benchmarks.model_step import goals, ratios, ratios_of_medians
from tests.sources import MeasuredRules

TINY = DecoderShape(layers=2, hidden=64, heads=4, kv_heads=2, mlp=96, vocab=50)
SEQ = 16


def tokens() -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (1, SEQ), generator=torch.Generator().manual_seed(0))


def test_the_patched_decoder_computes_the_eager_decoders_logits_and_gradients() -> None:
    eager = build_decoder(TINY)
    patched = tiletune.nn.patch(copy.deepcopy(eager))
    assert sum(isinstance(m, tiletune.nn.Linear) for m in patched.modules()) == 7 * TINY.layers + 1
    ids = tokens()
    torch.testing.assert_close(patched(ids), eager(ids), rtol=1e-4, atol=1e-4)
    next_token_loss(eager(ids), ids).backward()  # type: ignore[no-untyped-call]
    next_token_loss(patched(ids), ids).backward()  # type: ignore[no-untyped-call]
    for (name, mine), theirs in zip(patched.named_parameters(), eager.parameters(), strict=True):
        assert mine.grad is not None, name
        assert theirs.grad is not None, name
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_the_same_seed_builds_the_same_weights() -> None:
    first, second = build_decoder(TINY, seed=3), build_decoder(TINY, seed=3)
    for mine, theirs in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert not torch.equal(build_decoder(TINY, seed=4).head.weight, first.head.weight)


def test_each_round_times_every_variant_once_in_a_shuffled_order() -> None:
    calls: list[str] = []

    def logged(name: str, model: torch.nn.Module) -> Variant:
        def runner(ids: torch.Tensor) -> torch.Tensor:
            calls.append(name)
            out: torch.Tensor = model(ids)
            return out

        return Variant(name, name, model, runner)

    variants = [logged(name, build_decoder(TINY)) for name in "abc"]
    repeats = 6
    samples = measure(variants, tokens(), repeats)
    counts = {name: {kind: len(ms) for kind, ms in by_kind.items()} for name, by_kind in samples.items()}
    assert counts == {name: dict.fromkeys(STEPS, repeats) for name in "abc"}
    rounds = [calls[i : i + 3] for i in range(0, len(calls), 3)]  # each kind of each round: one call each
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    inference = rounds[::2]
    assert len({tuple(r) for r in inference}) > 1  # not one order every round
    followed = {name: {r[r.index(name) - 1] for r in inference if r.index(name) > 0} for name in "abc"}
    assert any(len(before) == 2 for before in followed.values())  # a fixed rotation gives one each
    first_run = list(calls)
    measure(variants, tokens(), repeats)
    assert calls[len(first_run) :] == first_run  # seeded: the same orders again


def test_spread_reports_the_median_and_nearest_rank_percentiles() -> None:
    found = spread([float(ms) for ms in (9, 1, 5, 3, 7, 2, 4, 6, 8, 10, 11)])
    assert found == {"median_ms": 6.0, "p10_ms": 2.0, "p90_ms": 10.0, "samples": 11}


def test_a_step_asks_one_config_per_operator_call_and_the_profile_sees_each_operator() -> None:
    variant = on_operators(build_decoder(TINY), "d", "tiny", MeasuredRules())
    ids = tokens()
    variant.step("inference", ids)  # every key answered once: the counted step is all hits
    cost = lookup_cost(variant, "inference", ids, step_ms=10.0)
    # per layer: q, k, v, o, gate, up, down, two norms, the attention; then the final norm and the head
    assert cost["calls_per_step"] == 10 * TINY.layers + 2
    assert cost["distinct_keys"] == 7  # the layers share their keys
    assert cost["get_share_of_step"] == pytest.approx(cost["calls_per_step"] * cost["get_ns_per_call"] / 10e6)
    profile = operator_shares(variant, "inference", ids)
    assert profile["operators"]["matmul"]["calls"] == 7 * TINY.layers + 1
    assert profile["operators"]["fused_attention"]["calls"] == TINY.layers
    assert profile["operators"]["rms_norm"]["calls"] == 2 * TINY.layers + 1
    assert 0 < profile["self_share"] <= profile["total_share"] <= 1.0


def _ratios(medians: dict[str, float]) -> dict[str, float]:
    return {
        "c_over_a": medians["c"] / medians["a"],
        "d_over_a": medians["d"] / medians["a"],
        "c_over_d": medians["c"] / medians["d"],
        "e_over_b": medians["e"] / medians["b"],
    }


def _sequence(
    seq: int, medians: dict[str, float], lookups_share: float, training: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "seq": seq,
        "ratios": {"inference": _ratios(medians), "training": _ratios(training or medians)},
        "lookups": {"inference": {"get_share_of_step": lookups_share}},
    }


def test_a_goal_is_met_only_when_every_sequence_meets_it() -> None:
    found = goals(
        [
            _sequence(1024, {"a": 100, "b": 80, "c": 101, "d": 99, "e": 80}, 0.001),
            _sequence(2048, {"a": 100, "b": 80, "c": 103, "d": 101, "e": 79}, 0.02),
        ]
    )
    assert found["d_over_a"]["values"] == {"1024": 0.99, "2048": 1.01}
    assert not found["d_over_a"]["met"]  # 2048 misses 1.00
    assert not found["c_over_a"]["met"]  # 1.03 at 2048 misses 1.02
    assert found["e_over_b"]["met"]  # 1.0 and 0.99
    assert not found["lookups_share"]["met"]


def test_the_training_goals_are_judged_on_the_training_medians() -> None:
    fast = {"a": 100.0, "b": 80.0, "c": 101.0, "d": 90.0, "e": 78.0}
    slow = {"a": 100.0, "b": 80.0, "c": 104.0, "d": 96.0, "e": 90.0}
    found = goals([_sequence(1024, fast, 0.001, training=slow), _sequence(2048, fast, 0.001, training=fast)])
    assert all(found[name]["met"] for name in ("d_over_a", "c_over_a", "e_over_b"))
    assert found["training_d_over_a"]["values"] == {"1024": 0.96, "2048": 0.9}
    assert found["training_d_over_a"]["met"]
    assert not found["training_c_over_a"]["met"]  # 1.04 at 1024
    assert not found["training_e_over_b"]["met"]  # 1.125 at 1024


def test_a_goal_at_one_length_is_judged_there_on_its_model_alone() -> None:
    fast = {"a": 100.0, "b": 80.0, "c": 101.0, "d": 90.0, "e": 78.0}
    slow = {"a": 100.0, "b": 80.0, "c": 101.0, "d": 96.0, "e": 78.0}
    sequences = [_sequence(1024, fast, 0.001, training=slow), _sequence(2048, fast, 0.001, training=fast)]
    found = goals(sequences, "decoder")
    assert found["training_d_over_a_at_2048"]["values"] == {"2048": 0.9}  # 1024's 0.96 is not judged
    assert found["training_d_over_a_at_2048"]["met"]
    assert "training_d_over_a_at_2048" not in goals(sequences, "llama")
    assert "training_d_over_a_at_2048" not in goals(sequences[:1], "decoder")  # no 2048: nothing to judge


def test_a_training_profile_names_each_operators_forward_and_backward() -> None:
    variant = on_operators(build_decoder(TINY), "d", "tiny", MeasuredRules())
    ids = tokens()
    variant.step("training", ids)
    phases = operator_shares(variant, "training", ids)["phases"]
    assert set(phases) == {"forward", "backward", "optimizer"}
    assert {"fused_attention", "rms_norm", "matmul"} <= set(phases["forward"])
    # the backward runs the backward operators (their tuned kernels) and matmul's transposed calls
    assert {"fused_attention_backward", "rms_norm_backward", "matmul"} <= set(phases["backward"])
    assert "fused_attention_backward" not in phases["forward"]
    assert phases["optimizer"] == {}
    assert 0 < sum(phases["backward"].values()) < 1


def test_the_judged_ratio_is_the_median_of_each_rounds_ratio() -> None:
    """Per ratio, each round's two times are divided first: a round that ran slow for every variant
    cancels, where a ratio of the medians mixes rounds."""
    rounds = {"a": [10.0, 20.0, 30.0], "c": [12.0, 26.0, 27.0]}
    samples = {name: {kind: rounds.get(name, rounds["a"]) for kind in STEPS} for name in "abcde"}
    assert ratios(samples, "inference")["c_over_a"] == pytest.approx(1.2)  # rounds: 1.2, 1.3, 0.9
    assert ratios(samples, "training")["e_over_b"] == pytest.approx(1.0)
    times = {name: {kind: spread(samples[name][kind]) for kind in STEPS} for name in samples}
    assert ratios_of_medians(times, "inference")["c_over_a"] == pytest.approx(1.3)  # 26 / 20
