"""The `tiletune` command line: the JSON contracts and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tiletune.service.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


@pytest.mark.parametrize("command", [[], ["kernels"], ["tune"], ["bench"]])
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: tiletune" in capsys.readouterr().out


def test_kernels_lists_builtins_with_dims_and_spaces(capsys: pytest.CaptureFixture[str]) -> None:
    document = run_json(capsys, "kernels")
    kernels = {k["name"]: k for k in document["kernels"]}
    assert set(kernels) >= {"fused_attention", "matmul", "softmax", "rms_norm", "add"}
    assert [d["name"] for d in kernels["fused_attention"]["dims"]] == [
        "batch",
        "heads",
        "kv_heads",
        "seq_q",
        "seq_kv",
        "head_dim",
        "causal",
        "mask",
    ]
    assert kernels["fused_attention"]["version"] == kernels["matmul"]["version"] == 2
    assert [d["choices"] for d in kernels["fused_attention"]["dims"][-2:]] == [[0, 1, 2], [0, 1]]
    assert [d["name"] for d in kernels["matmul"]["dims"]] == ["m", "n", "k", "a_transposed", "b_transposed"]
    assert {k["name"] for k in kernels["matmul"]["knobs"]} == {
        "tile_m",
        "tile_n",
        "tile_k",
        "buffer_num",
        "pipeline_depth",
    }
    assert "cpu" in document["devices"]


def test_tune_json_follows_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "tune", "add", "--shape", "n=100000", "--dtype", "float32", "--trials", "6")
    assert report["kernel"] == "add"
    assert report["shape"] == {"n": 100000}
    assert report["chip"].startswith("cpu/")
    assert report["space_size"] > 6
    assert report["trials"]["completed"] == 6
    assert {"invalid", "duplicate"} <= set(report["trials"])
    # the answer is a tiled config of the kernel's knobs, or torch's op where no tiled config beat it
    tiled = {"tile_size", "buffer_num", "pipeline_depth"}
    implementation = report["best"]["implementation"]
    assert implementation in {"vendor", report["backend"]}
    assert set(report["best"]["config"]) == ({"vendor"} if implementation == "vendor" else tiled)
    assert {"vendor": 1} in [row["config"] for row in report["validated"]]  # measured in the same run
    assert report["vendor"]["median_ms"] > 0
    assert report["speedup_vs_vendor"] == pytest.approx(
        report["vendor"]["median_ms"] / report["best"]["median_ms"]
    )
    assert report["best"]["median_ms"] > 0
    assert report["default"]["config"] == {"tile_size": 1024, "buffer_num": 2, "pipeline_depth": 3}
    # best and default come from one interleaved run; the best is the faster of the two there
    assert report["best"]["median_ms"] <= report["default"]["median_ms"]
    assert report["speedup_vs_default"] == pytest.approx(
        report["default"]["median_ms"] / report["best"]["median_ms"]
    )


def test_grid_measures_every_valid_config(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "tune", "add", "--shape", "n=3000", "--dtype", "float32", "--strategy", "grid")
    assert report["trials"]["completed"] + report["trials"].get("failed", 0) == report["space_size"]


def test_bench_measures_configs_the_default_and_the_vendor_op_interleaved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = run_json(
        capsys,
        "bench",
        "add",
        "--shape",
        "n=50000",
        "--dtype",
        "float32",
        "--config",
        '{"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}',
        "--config",
        '{"tile_size": 16384, "buffer_num": 1, "pipeline_depth": 1}',  # 192 KiB: fits any L2
    )
    results = document["results"]
    assert len(results) == 4
    assert [r["is_default"] for r in results] == [False, False, True, False]
    assert [r["is_vendor"] for r in results] == [False, False, False, True]
    assert results[3]["config"] is None
    assert all(r["samples"] == results[0]["samples"] for r in results)
    assert all(r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] for r in results)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "nope", "--shape", "n=4", "--dtype", "float32"], "unknown kernel 'nope'"),
        (["tune", "add", "--shape", "m=4", "--dtype", "float32"], "missing ['n']"),
        (["tune", "add", "--shape", "n=4,m=3", "--dtype", "float32"], "no dim(s) ['m']"),
        (["tune", "add", "--shape", "n=0", "--dtype", "float32"], "shape.n: must be a positive integer"),
        (["tune", "add", "--shape", "n=x", "--dtype", "float32"], "shape.n: must be an integer"),
        (["tune", "add", "--shape", "n", "--dtype", "float32"], "expected name=value pairs"),
        (["tune", "add", "--shape", "n=64", "--dtype", "float64"], "unknown dtype 'float64'"),
        (
            ["tune", "add", "--shape", "n=64", "--dtype", "float32", "--backend", "tpu"],
            "backend: unknown device",
        ),
        (
            ["tune", "add", "--shape", "n=64", "--dtype", "float32", "--trials", "0"],
            "trials: must be a positive",
        ),
        (
            [
                "tune",
                "fused_attention",
                "--shape",
                "batch=1,heads=1,seq_q=8,seq_kv=8,head_dim=8,causal=3",
                "--dtype",
                "float32",
            ],
            "shape.causal: must be one of [0, 1, 2]",
        ),
        (
            [
                "tune",
                "fused_attention",
                "--shape",
                "batch=1,heads=4,kv_heads=3,seq_q=8,seq_kv=8,head_dim=8,causal=2",
                "--dtype",
                "float32",
            ],
            "shape.kv_heads: must divide heads (4), got 3",
        ),
        (
            [
                "bench",
                "add",
                "--shape",
                "n=64",
                "--dtype",
                "float32",
                "--config",
                '{"tile_size": 3, "buffer_num": 1, "pipeline_depth": 1}',
            ],
            "config.tile_size: 3 is outside the space",
        ),
        (
            ["bench", "add", "--shape", "n=64", "--dtype", "float32", "--config", '{"tile_size": 64}'],
            "missing ['buffer_num', 'pipeline_depth']",
        ),
        (
            ["bench", "add", "--shape", "n=64", "--dtype", "float32", "--config", "{oops"],
            "config: not valid JSON",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert message in err


def test_tune_on_a_recorded_space_with_the_replay_backend(capsys: pytest.CaptureFixture[str]) -> None:
    # tests/conftest.py points at the bundled recorded spaces when ../shared/replay is absent
    report = run_json(
        capsys, "tune", "pnpoly_RTX_3090", "--backend", "replay", "--trials", "60", "--seed", "3"
    )
    assert report["chip"] == "replay/NVIDIA GeForce RTX 3090"
    assert report["trials"]["completed"] + report["trials"]["failed"] == 60
    assert report["best"]["median_ms"] <= report["default"]["median_ms"]
    assert report["space_size"] == 4092


def test_replay_backend_names_unknown_spaces(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "tune", "gemm", "--backend", "replay", "--replay-dir", str(tmp_path))
    assert code == 2
    assert "no recorded space 'gemm'" in err
