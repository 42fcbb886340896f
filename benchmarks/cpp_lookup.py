"""The C++ client's lookup cost: a hit, a nearest answer and a default, in ns (goal: a hit <= 100 ns).

Builds ``benchmarks/cpp_lookup.cpp`` with the machine's g++ (``-std=c++17 -O2``, the headers
``tiletune-config --cflags`` names), writes a sealed bundle of ``--entries`` tuned entries of
three real kernels (``native_add``, ``native_softmax``, ``fused_attention``: their declarations'
infos and default configs, float32 and float16) and runs it on ``--keys`` of its keys. Prints
the program's JSON document: the bundle's load time, and per kind the ns per lookup over its
batches (median, p10, p90, p99, min), with the share answered as expected. 200 rounds, each one
batch of 10,000 lookups of every kind (so a slow spell of the machine falls on all alike):

- ``exact_same_key``: one tuned key the whole batch, through a ``Table``: a host tiling function
  asked for the shape it was asked for at the last launch (the goal: a hit <= 100 ns);
- ``exact``: the tuned keys in turn (each lookup another key: the entries' cache lines cold);
- ``exact_via_client``: the same through a ``Client`` (its atomic table swap on each lookup);
- ``nearest``: each key with its first dim plus one (a scan of the kernel's entries of that
  dtype, then the config snapped to the shape), every fourth round, batches of 200;
- ``default``: a kernel the bundle lacks.

Run from the repository root: ``.venv/bin/python -m benchmarks.cpp_lookup``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from tiletune.client.cpp.config_tool import cflags
from tiletune.client.disk import write_bundle
from tiletune.client.space import DeviceLimits
from tiletune.client.wire import BestConfigPublic, ConfigBundle
from tiletune.kernels import get_declaration
from tiletune.kernels.info import kernel_info

SOURCE = Path(__file__).resolve().parent / "cpp_lookup.cpp"
CHIP = "cpu/Benchmark Chip/8c"
LIMITS = DeviceLimits(local_memory_bytes=1 << 20, cores=8)
KERNELS = ("native_add", "native_softmax", "fused_attention")


def random_shape(rng: random.Random, kernel: str) -> dict[str, int]:
    if kernel == "native_add":
        return {"n": rng.randrange(1, 1 << 24)}
    if kernel == "native_softmax":
        return {"rows": rng.randrange(1, 4096), "cols": rng.randrange(1, 8192)}
    heads = rng.choice((1, 2, 4, 8, 16, 32))
    seq = rng.randrange(16, 4096)
    return {
        "batch": rng.randrange(1, 16),
        "heads": heads,
        "kv_heads": heads,
        "seq_q": seq,
        "seq_kv": seq,
        "head_dim": rng.choice((64, 128)),
        "causal": rng.randint(0, 1),
        "mask": 0,
    }


def bundle(entries: int, seed: int) -> ConfigBundle:
    """``entries`` tuned entries (each a kernel's default config for its shape) with the kernels' infos."""
    rng = random.Random(seed)
    configs: list[BestConfigPublic] = []
    keys: set[tuple[str, str, str]] = set()
    while len(configs) < entries:
        kernel = rng.choice(KERNELS)
        declaration = get_declaration(kernel)
        shape, dtype = random_shape(rng, kernel), rng.choice(("float32", "float16"))
        shape_key = ",".join(f"{dim.name}={shape[dim.name]}" for dim in declaration.dims)
        if (kernel, shape_key, dtype) in keys:
            continue
        keys.add((kernel, shape_key, dtype))
        configs.append(
            BestConfigPublic(
                kernel=kernel,
                kernel_version=declaration.version,
                shape=shape,
                shape_key=shape_key,
                dtype=dtype,
                chip=CHIP,
                config=declaration.default_config(shape, dtype, LIMITS),
                median_ms=rng.random(),
                promoted_at=datetime.now(UTC),
            )
        )
    infos = [kernel_info(get_declaration(kernel), LIMITS) for kernel in KERNELS]
    return ConfigBundle(chip=CHIP, kernels=infos, configs=configs).sealed()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=10_000, help="tuned entries in the bundle")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys looked up in turn")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    compiler = shutil.which("g++")
    if compiler is None:
        sys.exit("g++ is needed")
    with tempfile.TemporaryDirectory() as folder:
        binary, path = Path(folder) / "cpp_lookup", Path(folder) / "bundle.json"
        subprocess.run([compiler, "-std=c++17", "-O2", cflags(), str(SOURCE), "-o", str(binary)], check=True)
        made = bundle(args.entries, args.seed)
        write_bundle(path, made)
        chosen = random.Random(args.seed).sample(made.configs, min(args.keys, len(made.configs)))
        lines = [f"{e.kernel} {e.dtype} {','.join(f'{k}={v}' for k, v in e.shape.items())}" for e in chosen]
        done = subprocess.run(
            [str(binary), str(path)], input="\n".join(lines), capture_output=True, text=True, check=True
        )
    result = {"benchmark": "cpp_lookup", **json.loads(done.stdout)}
    result["goal_hit_ns"] = 100
    result["hit_within_goal"] = result["exact_same_key"]["median_ns"] <= 100
    result["hit_in_turn_within_goal"] = result["exact"]["median_ns"] <= 100
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
