"""``tiletune.nn.transformers``: a Hugging Face Llama model with ``attn_implementation="tiletune"``
and ``tiletune.nn.patch`` runs on tiletune's operators with the results, the training and the
compiled graph of the same model on torch's ``sdpa``."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face integration needs the [models] extra (transformers)"
)

import torch._dynamo  # noqa: E402
from torch._dynamo.testing import CompileCounter  # noqa: E402
from torch.profiler import profile  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaRMSNorm  # noqa: E402

import tiletune.nn  # noqa: E402
import tiletune.nn.transformers as tiletune_transformers  # noqa: E402
from tiletune.nn import Linear  # noqa: E402

#: float32 through the kernels against torch's ops.
ATOL, RTOL = 1e-5, 1e-4
VOCAB = 100


def llama(attn_implementation: str, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer grouped-query Llama (4 heads, 2 kv heads), random weights (the same for a seed)."""
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    model: LlamaForCausalLM = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation
    )
    return model


def tiletune_llama() -> LlamaForCausalLM:
    tiletune_transformers.register()
    return tiletune.nn.patch(llama("tiletune"))


def token_ids(batch: int = 2, seq: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def tiletune_operators(model: torch.nn.Module, ids: torch.Tensor, **kwargs: torch.Tensor) -> set[str]:
    """The ``tiletune::`` operators a forward of ``model`` runs."""
    with profile() as trace:
        model(ids, **kwargs)
    return {event.name for event in trace.events() if event.name.startswith("tiletune::")}


def test_tiletune_nn_itself_imports_no_transformers() -> None:
    code = "import sys, tiletune.nn; print(sorted(m for m in sys.modules if m.startswith('transformers')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_register_names_the_attention_and_its_masks_once_and_again() -> None:
    tiletune_transformers.register()
    tiletune_transformers.register()
    assert transformers.AttentionInterface()["tiletune"] is tiletune_transformers.attention_forward
    assert "tiletune" in ALL_MASK_ATTENTION_FUNCTIONS


@pytest.mark.usefixtures("tiled_answers")
def test_a_llama_runs_on_the_operators_with_torchs_logits() -> None:
    model = tiletune_llama()
    norm = model.get_submodule("model.norm")
    assert isinstance(norm, LlamaRMSNorm)
    assert type(norm) is not LlamaRMSNorm
    assert type(model.get_submodule("model.layers.0.self_attn.q_proj")) is Linear
    assert model.state_dict().keys() == llama("sdpa").state_dict().keys()
    ids = token_ids()

    for reference in (llama("sdpa"), llama("eager")):
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=ATOL, rtol=RTOL)
    assert tiletune_operators(model, ids) == {
        "tiletune::fused_attention",
        "tiletune::rms_norm",
        "tiletune::matmul",
    }


@pytest.mark.usefixtures("tiled_answers")
def test_a_padding_mask_runs_the_operator_with_torchs_logits() -> None:
    model, reference = tiletune_llama(), llama("sdpa")
    ids = token_ids()
    attention_mask = torch.ones_like(ids)
    attention_mask[0, :5] = 0  # left padding

    ours, theirs = (m(ids, attention_mask=attention_mask).logits for m in (model, reference))
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
    assert {"tiletune::fused_attention", "tiletune::rms_norm"} <= tiletune_operators(
        model, ids, attention_mask=attention_mask
    )


#: Tokens the greedy generation test decodes.
NEW_TOKENS = 6


@pytest.mark.usefixtures("tiled_answers")
def test_greedy_generation_decodes_on_the_operator_as_sdpa_does() -> None:
    model, reference = tiletune_llama(), llama("sdpa")
    ids = token_ids(batch=1, seq=8)

    def generate(llama: Any) -> torch.Tensor:  # transformers' own typing of generate() is loose
        tokens: torch.Tensor = llama.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        return tokens

    with profile() as trace:
        generated = generate(model)
    assert torch.equal(generated, generate(reference))
    # The prompt and each new token but the last: one forward each, on the operator in both layers.
    attention_calls = [event for event in trace.events() if event.name == "tiletune::fused_attention"]
    assert len(attention_calls) == 2 * NEW_TOKENS


@pytest.mark.skipif(
    not hasattr(transformers.PreTrainedModel, "set_attn_implementation"),
    reason="set_attn_implementation is newer than this transformers",
)
@pytest.mark.usefixtures("tiled_answers")
def test_set_attn_implementation_moves_a_built_model_to_the_operator() -> None:
    tiletune_transformers.register()
    model, reference = llama("sdpa"), llama("sdpa")
    model.set_attn_implementation("tiletune")
    ids = token_ids()

    assert "tiletune::fused_attention" in tiletune_operators(model, ids)
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=ATOL, rtol=RTOL)


def test_training_steps_match_torchs_losses_and_parameters() -> None:
    model, reference = tiletune_llama(), llama("sdpa")
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    for step in range(3):
        ids = token_ids(seed=10 + step)
        losses = []
        for trained, optimizer in zip((model, reference), optimizers, strict=True):
            optimizer.zero_grad()
            loss = trained(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], atol=ATOL, rtol=RTOL, msg=f"step {step}")
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4, msg=name)


def test_the_patched_llama_compiles_whole() -> None:
    model, reference = tiletune_llama(), llama("sdpa")
    for dynamic in (False, True):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=counter)
        for seq in (24, 31):
            ids = token_ids(seq=seq)
            torch.testing.assert_close(compiled(ids).logits, reference(ids).logits, atol=ATOL, rtol=RTOL)
        assert counter.frame_count >= 1
    ids = token_ids()
    compiled(ids, labels=ids).loss.backward()
    reference(ids, labels=ids).loss.backward()
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None, name
        torch.testing.assert_close(mine.grad, theirs.grad, atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize(
    ("weight_dtype", "input_dtype", "eps"),
    [
        (torch.float32, torch.float32, 1e-6),
        (torch.bfloat16, torch.bfloat16, 1e-6),
        (torch.float32, torch.bfloat16, 1e-6),  # Llama's result: float32
        (torch.float32, torch.float32, 1e-5),  # many checkpoints' eps: the operator's argument
        (torch.bfloat16, torch.bfloat16, 1e-5),
    ],
)
def test_a_patched_hf_rms_norm_keeps_llamas_dtypes_and_results(
    weight_dtype: torch.dtype, input_dtype: torch.dtype, eps: float
) -> None:
    torch.manual_seed(0)
    reference = LlamaRMSNorm(64, eps=eps).to(weight_dtype)  # type: ignore[no-untyped-call]
    reference.weight.data.uniform_(0.5, 1.5)
    model = torch.nn.Sequential(LlamaRMSNorm(64, eps=eps).to(weight_dtype))  # type: ignore[no-untyped-call]
    model.load_state_dict(torch.nn.Sequential(reference).state_dict())
    tiletune.nn.patch(model)
    x = torch.randn(3, 5, 64).to(input_dtype)

    ours, theirs = model(x), reference(x)
    assert ours.dtype == theirs.dtype
    # One rounding of the narrower dtype apart at most (see tiletune.nn.hf_rms_norm).
    atol, rtol = (1e-5, 1e-4) if input_dtype == torch.float32 else (2e-2, 8e-3)
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=rtol)
    assert "tiletune::rms_norm" in tiletune_operators(model, x)  # at any variance_epsilon


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_a_patched_hf_rms_norm_computes_at_its_variance_epsilon(eps: float) -> None:
    """``x`` of magnitude 1e-3 makes ``mean(x^2)`` about 1e-6, so that the eps moves the result."""
    torch.manual_seed(0)
    reference = LlamaRMSNorm(64, eps=eps)  # type: ignore[no-untyped-call]
    reference.weight.data.uniform_(0.5, 1.5)
    model = torch.nn.Sequential(LlamaRMSNorm(64, eps=eps))  # type: ignore[no-untyped-call]
    model.load_state_dict(torch.nn.Sequential(reference).state_dict())
    tiletune.nn.patch(model)
    x = torch.randn(3, 5, 64) * 1e-3
    torch.testing.assert_close(model(x), reference(x), atol=ATOL, rtol=RTOL)
    at_default = LlamaRMSNorm(64, eps=1e-6)  # type: ignore[no-untyped-call]
    at_default.load_state_dict(reference.state_dict())
    assert not torch.allclose(model(x), at_default(x), rtol=1e-3)  # the case tells the eps apart


class OffsetRMSNorm(torch.nn.Module):
    """Gemma's kind of norm: ``(1 + weight)``, its ``eps`` under another name; not Llama's."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(hidden))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed * (1.0 + self.weight)


def test_patch_leaves_an_rms_norm_of_another_kind_alone() -> None:
    model = tiletune.nn.patch(torch.nn.Sequential(OffsetRMSNorm(64)))
    assert type(model[0]) is OffsetRMSNorm
    summary = tiletune.nn.patch_summary(model)
    assert summary is not None
    assert (summary.replaced, summary.left) == ({}, {("OffsetRMSNorm", "not Llama's kind of RMSNorm"): 1})


def test_the_patch_summary_counts_llamas_linears_and_rms_norms() -> None:
    model, reference = tiletune_llama(), llama("sdpa")
    summary = tiletune.nn.patch_summary(model)
    expected = {
        "Linear": sum(type(module) is torch.nn.Linear for module in reference.modules()),
        "LlamaRMSNorm": sum(type(module) is LlamaRMSNorm for module in reference.modules()),
    }
    assert expected == {"Linear": 2 * 7 + 1, "LlamaRMSNorm": 2 * 2 + 1}  # per layer, and the head's
    assert summary == tiletune.nn.PatchSummary(replaced=expected, left={}, attention="routed")
    assert str(summary).startswith("tiletune.patch: replaced 15 Linear, 5 LlamaRMSNorm; attention routed")


def test_a_patched_llama_pickles_whole_and_loads_on_the_operators() -> None:
    """``torch.save(model)``: the tiletune RMSNorm classes are made at run time, yet the model loads
    (in a fresh process that registered the attention, as a user's would) with them and gives the
    same logits."""
    model = tiletune_llama()
    ids = token_ids()
    expected = model(ids).logits
    code = (
        "import pickle, sys, torch\n"
        "import tiletune.nn.transformers\n"
        "tiletune.nn.transformers.register()  # the attention's name, as in the process that saved it\n"
        "model, ids = pickle.loads(sys.stdin.buffer.read())\n"
        "print(type(model.model.norm).__module__)\n"
        "sys.stdout.buffer.write(pickle.dumps(model(ids).logits.detach()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps((model, ids)), capture_output=True, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    first_line, _, logits = result.stdout.partition(b"\n")
    assert first_line.decode() == "tiletune.nn.hf_rms_norm"
    torch.testing.assert_close(pickle.loads(logits), expected.detach())
