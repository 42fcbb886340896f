"""The C++ client (``client/cpp/include/tiletune``) against the Python client, on the same files.

One g++ build of ``tests/client/cpp_driver.cpp`` (``-std=c++17 -O2 -Wall -Wextra -Werror``) per
session; the driver answers keys from a bundle file and this module asks
:class:`~tiletune.client.ConfigClient` the same keys from the same file (its disk cache): a
randomised bundle (seeded) of kernels with size, categorical and defaulted dims, two versions,
three dtypes, two clamp rules, entries of another chip, duplicates and configs the knobs refuse.
The pieces the checksum needs (SHA-256, Python's float repr, pydantic's datetimes) are checked
against Python on many inputs; a refused file (garbled, wrong checksum) answers the default.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import struct
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from tiletune.client import ClientSettings, ConfigClient
from tiletune.client.cpp import config_tool
from tiletune.client.disk import DiskCache
from tiletune.client.wire import ConfigBundle

DRIVER = Path(__file__).resolve().parent / "cpp_driver.cpp"
CHIP = "cpu/C++ Client Chip (AVX2)/2c"
OTHER_CHIP = "cpu/Another Chip/4c"
SIZES = (1, 3, 8, 16, 64, 100, 256, 1000, 1024, 4096)
DTYPES = ("float32", "float16", "bfloat16")
KEYS = 1500


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test driver, built once against the headers ``tiletune-config --cflags`` names."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ is needed to build the C++ client's tests")
    binary = tmp_path_factory.mktemp("cpp") / "cpp_driver"
    command = [compiler, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", config_tool.cflags()]
    built = subprocess.run(
        [*command, str(DRIVER), "-o", str(binary)], check=False, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    return binary


def run(driver: Path, *args: str, stdin: str = "") -> list[str]:
    done = subprocess.run([str(driver), *args], input=stdin, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


# -- a randomised bundle ---------------------------------------------------------------------------


def kernel_infos() -> list[dict[str, Any]]:
    """Four kernels: tiles clamped by ``min``; attention-like with a categorical and a defaulted
    dim under ``pow2_ceil``; one without knob values (names checked only); one whose info the
    bundle lacks is ``bare`` (entries only)."""
    return [
        {
            "name": "tiles",
            "version": 2,
            "dims": ["m", "n"],
            "knobs": ["tile_m", "tile_n", "buffer_num"],
            "knob_values": {"tile_m": [16, 64, 256], "tile_n": [8, 32, 128, 512], "buffer_num": [1, 2, 4]},
            "clamp_to": {"tile_m": "m", "tile_n": "n"},
        },
        {
            "name": "attn",
            "version": 1,
            "dims": ["heads", "kv_heads", "seq", "causal"],
            "categorical": ["causal"],
            "knobs": ["block", "stages"],
            "knob_values": {"block": [16, 32, 64, 128], "stages": [1, 2, 3]},
            "clamp_to": {"block": "seq"},
            "clamp_rule": "pow2_ceil",
            "dim_defaults": {"kv_heads": "heads"},
        },
        {"name": "loose", "version": 1, "dims": ["n"], "knobs": ["tile"]},
    ]


def random_shape(rng: random.Random, kernel: str) -> dict[str, int]:
    """A shape of ``kernel`` from a small grid (so that keys repeat and distances tie)."""
    if kernel == "attn":
        heads = rng.choice((1, 8, 16))
        return {
            "heads": heads,
            "kv_heads": rng.choice((heads, 1)),
            "seq": rng.choice(SIZES),
            "causal": rng.randint(0, 1),
        }
    if kernel == "tiles":
        return {"m": rng.choice(SIZES), "n": rng.choice(SIZES)}
    return {"n": rng.choice(SIZES)}


def random_config(rng: random.Random, kernel: str, shape: dict[str, int]) -> dict[str, int]:
    """A config the knobs allow for ``shape`` mostly; now and then one they refuse."""
    if kernel == "attn":
        cap = max(1 << (shape["seq"] - 1).bit_length(), 16)
        config = {"block": min(rng.choice((16, 32, 64, 128)), cap), "stages": rng.choice((1, 2, 3))}
    elif kernel == "tiles":
        config = {
            "tile_m": min(rng.choice((16, 64, 256)), shape["m"]),
            "tile_n": min(rng.choice((8, 32, 128, 512)), shape["n"]),
            "buffer_num": rng.choice((1, 2, 4)),
        }
    else:
        config = {"tile": rng.choice((4, 32, 512))}
    roll = rng.random()
    if roll < 0.05:
        config[next(iter(config))] = 3  # outside the values (for the kernels that list them)
    elif roll < 0.08:
        config["extra"] = 1  # not the kernel's knobs
    elif roll < 0.2:
        config = dict(reversed(list(config.items())))  # the knobs in another order than the kernel's
    return config


def promoted_text(rng: random.Random, stamp: datetime) -> str:
    """``stamp`` in one of the forms pydantic reads and the C++ normalises."""
    form = rng.randrange(4)
    if form == 0:
        return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    if form == 1:
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    if form == 2:
        return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "+05:30"
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123-01:00"


def random_entry(rng: random.Random, index: int) -> dict[str, Any]:
    kernel = rng.choice(("tiles", "tiles", "attn", "attn", "loose", "bare"))
    shape = random_shape(rng, kernel)
    if kernel == "attn" and rng.random() < 0.5:
        shape = dict(reversed(list(shape.items())))  # the key is the shape_key, not the dims' order
    version = {"tiles": 2, "attn": 1}.get(kernel, 1) if rng.random() < 0.8 else 7
    entry: dict[str, Any] = {
        "kernel": kernel,
        "kernel_version": version,
        "shape": shape,
        "shape_key": ",".join(f"{dim}={shape[dim]}" for dim in sorted(shape, key=_dim_order(kernel))),
        # now and then a key the server would not write (dims reversed): an exact match only by that text
        "dtype": rng.choice(DTYPES),
        "chip": CHIP if rng.random() < 0.9 else OTHER_CHIP,
        "config": random_config(rng, kernel, shape),
        "median_ms": rng.choice((1, rng.random() * 10 ** rng.randint(-9, 20), 0.1, 1e16)),
        "software": {"torch": "2.13.0", "naïve—tool": None, 'quote"\n': "\u2028"},
        "promoted_at": promoted_text(rng, datetime(2025, 1, 1 + index % 28, rng.randrange(24), 0, 7, 250000)),
        "unknown_field": [1, 2, {"ignored": True}],
    }
    if rng.random() < 0.5:
        entry.update(
            default_config=dict(entry["config"]), default_ms=rng.random(), job_id=index, trial_id=None
        )
    return entry


def _dim_order(kernel: str) -> Any:
    order = {"attn": ["heads", "kv_heads", "seq", "causal"], "tiles": ["m", "n"]}.get(kernel, ["n"])
    return order.index


def random_bundle(seed: int, entries: int = 400) -> dict[str, Any]:
    """A sealed bundle document as hand-written JSON (the checksum computed by pydantic)."""
    rng = random.Random(seed)
    configs = [random_entry(rng, i) for i in range(entries)]
    for i in range(0, min(entries, 90), 3):  # the same keys again, promoted later (wins) or earlier
        when = rng.choice(("2026-06-01T00:00:00Z", "2024-06-01T00:00:00+02:00"))
        shape = configs[i]["shape"]
        configs.append(
            dict(configs[i], promoted_at=when, config=random_config(rng, configs[i]["kernel"], shape))
        )
    document: dict[str, Any] = {
        "format": "tiletune.configs/1",
        "chip": CHIP,
        "kernels": kernel_infos(),
        "configs": configs,
    }
    document["checksum"] = ConfigBundle.model_validate(document).content_checksum()
    return document


def random_keys(
    rng: random.Random, bundle: dict[str, Any], count: int
) -> Iterator[tuple[str, dict[str, int], str, int | None]]:
    """Launch keys: entries' own shapes (dims in any order), grid shapes, shapes lacking the
    defaulted dim, odd dims, unknown kernels, and keys the client refuses."""
    for _ in range(count):
        kernel = rng.choice(("tiles", "attn", "loose", "bare", "nothing"))
        roll = rng.random()
        if roll < 0.4:
            entry = rng.choice(bundle["configs"])
            kernel, shape, dtype = entry["kernel"], dict(entry["shape"]), entry["dtype"]
            items = list(shape.items())
            rng.shuffle(items)
            shape = dict(items)
        else:
            shape, dtype = random_shape(rng, kernel if kernel != "nothing" else "loose"), rng.choice(DTYPES)
        if kernel == "attn" and rng.random() < 0.3:
            shape.pop("kv_heads", None)
        if rng.random() < 0.05:
            shape["extra"] = 4
        if rng.random() < 0.03:
            shape[next(iter(shape))] = 0
        if rng.random() < 0.02:
            dtype = "a-dtype-far-too-long"
        yield kernel, shape, dtype, rng.choice((None, None, 1, 2, 7))


def key_line(kernel: str, shape: dict[str, int], dtype: str, version: int | None) -> str:
    dims = ",".join(f"{name}={value}" for name, value in shape.items()) or "-"
    return f"{kernel} {dtype} {'-' if version is None else version} {dims}"


def python_answers(cache: Path, keys: list[tuple[str, dict[str, int], str, int | None]]) -> list[str]:
    """The Python client's answers, from its disk cache, one client per pinned version."""
    answers = []
    clients: dict[int | None, ConfigClient] = {}
    for kernel, shape, dtype, version in keys:
        if version not in clients:
            pins = (
                None
                if version is None
                else dict.fromkeys(("tiles", "attn", "loose", "bare", "nothing"), version)
            )
            clients[version] = ConfigClient(
                None, CHIP, settings=ClientSettings(cache_dir=cache, kernel_versions=pins)
            )
        tiling = clients[version].get(kernel, shape, dtype)
        config = ",".join(sorted(f"{name}={value}" for name, value in tiling.config.items()))
        answers.append(f"{tiling.match} {config}")
    for client in clients.values():
        client.close()
    return answers


# -- the same answers --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_answers_as_the_python_client(driver: Path, tmp_path: Path, seed: int) -> None:
    bundle = random_bundle(seed)
    cache = tmp_path / "cache"
    path = DiskCache(cache, CHIP).path
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(bundle, ensure_ascii=False, indent=1))
    keys = list(random_keys(random.Random(seed), bundle, KEYS))
    expected = python_answers(cache, keys)
    state, *answers = run(driver, "lookup", str(path), CHIP, stdin="\n".join(key_line(*key) for key in keys))
    assert state == "ok"
    mismatches = [(key, py, cpp) for key, py, cpp in zip(keys, expected, answers, strict=True) if py != cpp]
    assert mismatches == [], mismatches[:5]
    matches = {answer.split()[0] for answer in answers}
    assert matches == {"exact", "nearest", "default"}  # the set exercises every branch


def test_a_bundle_the_python_client_wrote_is_read(driver: Path, tmp_path: Path) -> None:
    """The disk cache as the Python client saves it (pydantic's JSON: canonical datetimes)."""
    source = tmp_path / "source.json"
    source.write_text(json.dumps(random_bundle(4)))
    client = ConfigClient(None, CHIP, settings=ClientSettings(cache_dir=tmp_path / "cache"))
    assert client.import_bundle(source) > 0
    client.close()
    path = DiskCache(tmp_path / "cache", CHIP).path
    keys = list(random_keys(random.Random(4), random_bundle(4), 300))
    state, *answers = run(driver, "lookup", str(path), "-", stdin="\n".join(key_line(*key) for key in keys))
    assert state == "ok"
    assert answers == python_answers(tmp_path / "cache", keys)


def test_entries_of_the_chip_asked_for(driver: Path, tmp_path: Path) -> None:
    entry = {
        "kernel": "loose",
        "kernel_version": 1,
        "shape": {"n": 8},
        "shape_key": "n=8",
        "dtype": "float32",
        "chip": OTHER_CHIP,
        "config": {"tile": 4},
        "median_ms": 1.0,
        "promoted_at": "2025-01-01T00:00:00Z",
    }
    document = {"chip": CHIP, "kernels": kernel_infos(), "configs": [entry]}
    document["checksum"] = ConfigBundle.model_validate(document).content_checksum()
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(document))
    key = key_line("loose", {"n": 8}, "float32", None)
    assert run(driver, "lookup", str(path), "-", stdin=key)[1] == "default "  # the bundle's chip
    assert run(driver, "lookup", str(path), OTHER_CHIP, stdin=key)[1] == "exact tile=4"


# -- refused files: every answer the default -------------------------------------------------------


def refused_files(document: dict[str, Any]) -> dict[str, bytes]:
    text = json.dumps(document).encode()
    changed = json.loads(text)
    changed["configs"][0]["config"] = {"tile_m": 16, "tile_n": 8, "buffer_num": 1}
    no_checksum = dict(document, checksum=None)
    return {
        "wrong checksum": json.dumps(changed).encode(),
        "no checksum": json.dumps(no_checksum).encode(),
        "truncated": text[: len(text) // 2],
        "not JSON": b"<html>502 Bad Gateway</html>",
        "invalid UTF-8": text.replace(b'"float32"', b'"float\xff32"', 1),
        "trailing comma": text[:-1] + b",}",
        "empty": b"",
        "another format": json.dumps(dict(document, format="tiletune.configs/2")).encode(),
        "NaN": text.replace(b'"median_ms": ', b'"median_ms": NaN, "x": ', 1),
        "deep": b"[" * 100 + b"]" * 100,
    }


def test_refused_files_answer_the_default(driver: Path, tmp_path: Path) -> None:
    document = random_bundle(5, entries=60)
    keys = list(random_keys(random.Random(5), document, 200))
    stdin = "\n".join(key_line(*key) for key in keys)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document))
    assert run(driver, "lookup", str(good), "-", stdin=stdin)[0] == "ok"
    for name, content in refused_files(document).items():
        path = tmp_path / "bad.json"
        path.write_bytes(content)
        state, *answers = run(driver, "lookup", str(path), "-", stdin=stdin)
        assert state.startswith("refused: "), name
        assert set(answers) == {"default "}, name
    state, *answers = run(driver, "lookup", str(tmp_path / "missing.json"), "-", stdin=stdin)
    assert state.startswith("refused: cannot open")
    assert set(answers) == {"default "}


def test_the_checksum_is_what_the_python_client_computes(driver: Path, tmp_path: Path) -> None:
    document = random_bundle(6, entries=50)
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(dict(document, checksum=document["checksum"].upper())))
    assert run(driver, "lookup", str(path), "-")[0] == "refused: the checksum does not match the entries"


# -- the checksum's pieces against Python -------------------------------------------------------------


def test_sha256_matches_hashlib(driver: Path) -> None:
    rng = random.Random(7)
    inputs = [bytes(rng.randrange(256) for _ in range(size)) for size in (*range(0, 130), 1000, 4097, 65536)]
    assert run(driver, "sha256", stdin="\n".join(data.hex() for data in inputs) + "\n") == [
        hashlib.sha256(data).hexdigest() for data in inputs
    ]


def test_floats_are_written_as_python_repr(driver: Path) -> None:
    rng = random.Random(8)
    values = [0.0, -0.0, 1.0, 0.1, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308]
    values += [rng.random() * 10 ** rng.randint(-30, 30) for _ in range(5000)]
    values += [round(rng.random() * 1000, rng.randint(0, 6)) for _ in range(2000)]
    while len(values) < 12000:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            values.append(value)
    bits = "\n".join(struct.pack(">d", value).hex() for value in values)
    assert run(driver, "float", stdin=bits) == [repr(value) for value in values]


def test_datetimes_are_written_as_pydantic_writes_them(driver: Path) -> None:
    rng = random.Random(9)
    texts = [
        "2024-02-29T23:59:59.999999Z",
        "2023-02-29T00:00:00Z",
        "2024-01-01",
        "2024-01-01T10:20",
        "2024-01-01t00:00:00z",
        "2024-01-01T00:00:00+0100",
        "2024-01-01T00:00:00,5Z",
        "2024-13-01T00:00:00",
        "2024-01-01T24:00:00",
        "2024-01-01T00:00:00+24:00",
        "2024-01-01T00:00:00.Z",
        "0000-01-01T00:00:00",
        "2024-01-01T00:00:00-00:00",
        "2024-01-01T00:00:00.1234567+23:59",
        "2024-1-01T00:00:00",
        "not a date",
    ]
    for _ in range(500):
        stamp = f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 31):02d}"
        stamp += (
            rng.choice("T t") + f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        )
        stamp += rng.choice(("", f".{rng.randrange(10**6):06d}", f".{rng.randrange(1000)}", ".0"))
        stamp += rng.choice(
            ("", "Z", f"+{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}", "-00:00", "-0130")
        )
        texts.append(stamp)
    adapter = TypeAdapter(datetime)
    expected = []
    for text in texts:
        try:
            expected.append(adapter.dump_python(adapter.validate_json(json.dumps(text)), mode="json"))
        except ValueError:
            expected.append("!")
    got = [line.split(" ")[0] for line in run(driver, "datetime", stdin="\n".join(texts))]
    assert got == expected


def test_the_disk_cache_path_is_the_python_clients(
    driver: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILETUNE_CACHE_DIR", str(tmp_path))
    for chip in (CHIP, "cpu/Intel Xeon (AVX-512)/2c", "__", "npu/Ascend 910B·x/1c", "a..b--c"):
        assert run(driver, "cache-path", chip) == [str(DiskCache(tmp_path, chip).path)]


# -- threads --------------------------------------------------------------------------------------


def test_readers_see_one_table_or_the_other_while_it_reloads(driver: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(random_bundle(10, entries=100)))
    second.write_text(json.dumps(random_bundle(11, entries=100)))
    keys = list(random_keys(random.Random(10), random_bundle(10, entries=100), 200))
    stdin = "\n".join(key_line(*key) for key in keys)
    (line,) = run(driver, "threads", str(tmp_path / "live.json"), str(first), str(second), stdin=stdin)
    counts = dict(zip(line.split()[::2], map(int, line.split()[1::2]), strict=True))
    assert counts["wrong"] == 0
    assert counts["reloads"] == 200
    assert counts["answers"] > 1000


def test_the_config_tool_prints_the_include_flags() -> None:
    assert (config_tool.include_dir() / "tiletune" / "config.hpp").is_file()
    done = subprocess.run(
        ["python3", str(Path(config_tool.__file__)), "--cflags"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"-I{config_tool.include_dir()}"
