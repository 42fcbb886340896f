"""Every declared kernel's space, written down: what the space-equality test compares against.

:func:`describe` reads a declaration (its attributes, and per sample shape, dtype and chip: the
knobs' values, the default config, the space's size and digest, byte and flop counts, a constraint
verdict for configs outside the space) into plain JSON. ``declared_spaces.json`` beside this file is
that description of every built-in declaration as it was before the kernels became families; the
test (``test_family_spaces.py``) checks that moving code between files changed none of it.

Rewrite the file only for a change that means to change a space (and say so in the commit)::

    .venv/bin/python -m tests.kernels.spaces --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from tiletune.client.space import DeviceLimits
from tiletune.kernels.declaration import Config, KernelDeclaration, Shape
from tiletune.kernels.declarations import all_declarations

GOLDEN = Path(__file__).with_name("declared_spaces.json")

_ATTENTION = {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 32, "mask": 0}
#: Sample shapes per set of dim names (a kernel's twins share its dims).
SHAPES: dict[tuple[str, ...], list[Shape]] = {
    ("n",): [{"n": 1}, {"n": 4099}, {"n": 1 << 20}],
    ("rows", "cols"): [{"rows": 37, "cols": 300}, {"rows": 1024, "cols": 512}, {"rows": 8, "cols": 32000}],
    ("m", "n", "k"): [{"m": 37, "n": 100, "k": 300}, {"m": 1024, "n": 512, "k": 512}],
    ("m", "n", "k", "a_transposed", "b_transposed"): [
        {"m": 37, "n": 100, "k": 300, "a_transposed": 0, "b_transposed": 1},
        {"m": 1024, "n": 512, "k": 512, "a_transposed": 1, "b_transposed": 0},
    ],
    ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "mask"): [
        {**_ATTENTION, "seq_q": 37, "seq_kv": 50, "causal": 1},
        {**_ATTENTION, "seq_q": 256, "seq_kv": 256, "causal": 0, "mask": 1},
        {**_ATTENTION, "seq_q": 100, "seq_kv": 300, "causal": 2},
    ],
}
DTYPES = ("float32", "float16")
LIMITS = {
    "cpu-2": DeviceLimits(local_memory_bytes=512 * 1024, kind="cpu", cores=2),
    "cpu": DeviceLimits(local_memory_bytes=1 << 20, kind="cpu"),
    "cuda": DeviceLimits(local_memory_bytes=228 * 1024, max_buffer_num=4, alignment_bytes=128, kind="cuda"),
    "npu": DeviceLimits(local_memory_bytes=192 * 1024, max_buffer_num=8, kind="npu", cores=24),
}


def _digest(configs: list[Config]) -> str:
    text = json.dumps(sorted(json.dumps(c, sort_keys=True) for c in configs))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sample_digest(described: dict[str, Any]) -> str:
    """A sample's description, but its default config, as one digest (what the file keeps)."""
    rest = {key: value for key, value in described.items() if key != "default"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]


def _outside(declaration: KernelDeclaration, default: Config) -> list[Config]:
    """Configs next to the default that break one rule each: every knob doubled, then set to 3."""
    changed = []
    for knob in declaration.knobs:
        if knob.name in default:
            changed.append({**default, knob.name: default[knob.name] * 2})
            changed.append({**default, knob.name: 3})
    return changed


def sample(declaration: KernelDeclaration, shape: Shape, dtype: str, limits: DeviceLimits) -> dict[str, Any]:
    """What ``declaration`` declares at one shape, dtype and chip."""
    default = declaration.default_config(shape, dtype, limits)
    space = declaration.space(shape, dtype, limits)
    return {
        "knob_values": {k: list(v) for k, v in declaration.knob_values(shape, limits).items()},
        "default": default,
        "space_size": len(space),
        "space": _digest(space),
        "outside": [
            declaration.config_problem(c, shape, dtype, limits) for c in _outside(declaration, default)
        ],
        "working_set": declaration.working_set_bytes(default, shape, dtype),
        "bytes_moved": declaration.bytes_moved(shape, dtype),
        "flops": declaration.flops(shape),
        "tensor_bytes": declaration.tensor_bytes(shape, dtype),
        "workspace_bytes": declaration.workspace_bytes(shape, dtype),
    }


def describe(declaration: KernelDeclaration) -> dict[str, Any]:
    """What a declaration declares, as JSON (see the module docstring)."""
    dims = tuple(d.name for d in declaration.dims)
    samples = {}
    for shape in SHAPES.get(dims, []):
        canonical = declaration.canonical_shape(shape)
        for dtype in DTYPES:
            for chip, limits in LIMITS.items():
                described = json.loads(json.dumps(sample(declaration, shape, dtype, limits)))
                samples[f"{canonical} {dtype} {chip}"] = [described["default"], sample_digest(described)]
    return {
        "version": declaration.version,
        "description": declaration.description,
        "dims": [[d.name, d.choices, d.default] for d in declaration.dims],
        "knobs": [[k.name, list(k.values), k.clamp_to, k.clamp, k.up_to] for k in declaration.knobs],
        "implementations": list(declaration.implementations),
        "has_vendor": declaration.has_vendor,
        "backward_kernel": declaration.backward_kernel,
        "build_knobs": list(declaration.build_knobs),
        "samples": samples,
    }


def describe_all() -> dict[str, Any]:
    """Every declared kernel's description, by name (JSON round-tripped, as the file holds it)."""
    described = {name: describe(declaration) for name, declaration in sorted(all_declarations().items())}
    loaded: dict[str, Any] = json.loads(json.dumps(described))
    return loaded


def as_text(described: dict[str, Any]) -> str:
    """The file's text: a line per kernel's attributes and a line per sample (diffs read line by line)."""
    lines = ["{"]
    for index, (name, kernel) in enumerate(described.items()):
        attributes = {key: value for key, value in kernel.items() if key != "samples"}
        lines.append(f" {json.dumps(name)}: {{")
        lines.append(f"  {json.dumps(attributes, sort_keys=True)[1:-1]},")
        samples = [f"   {json.dumps(key)}: {json.dumps(value)}" for key, value in kernel["samples"].items()]
        lines.append('  "samples": {\n' + ",\n".join(samples) + "\n  }")
        lines.append(" }" + ("," if index < len(described) - 1 else ""))
    return "\n".join([*lines, "}"]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help=f"rewrite {GOLDEN.name} from the code as it is")
    args = parser.parse_args()
    text = as_text(describe_all())
    if args.write:
        GOLDEN.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
