"""benchmarks/plot.py: every benchmark's main figure drawn from its JSON document, as a PNG."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.plot import DPI, PLOTS, main, plot
from benchmarks.plots.kernels import shape_label
from tests.benchmarks.documents import DOCUMENTS, REPLAY_WORKER_COST

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
FIGURES = ROOT / "docs" / "figures"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file, from its header; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def write(folder: Path, document: dict[str, Any]) -> Path:
    path = folder / f"{document['benchmark']}.json"
    path.write_text(json.dumps(document))
    return path


def benchmark_scripts() -> set[str]:
    """The benchmarks in benchmarks/: every module but the package's and the plot command."""
    return {path.stem for path in BENCHMARKS.glob("*.py")} - {"__init__", "plot"}


def test_every_benchmark_has_a_plot_and_a_test_document() -> None:
    assert set(PLOTS) == benchmark_scripts()
    assert set(DOCUMENTS) == set(PLOTS)


@pytest.mark.parametrize("name", sorted(benchmark_scripts()))
def test_each_benchmark_names_itself_in_its_document(name: str) -> None:
    """The ``benchmark`` field is what plot.py dispatches on: each script must print its own name."""
    assert f'"benchmark": "{name}"' in (BENCHMARKS / f"{name}.py").read_text()


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_each_plot_is_drawn_from_a_small_document(name: str, tmp_path: Path) -> None:
    json_path = write(tmp_path, DOCUMENTS[name])
    png_path = tmp_path / "figure.png"
    plot(json_path, png_path)
    width, height = png_size(png_path)
    assert width >= 6 * DPI
    assert height >= 2 * DPI


def test_replay_worker_cost_without_the_service_run_is_drawn(tmp_path: Path) -> None:
    document = {key: value for key, value in REPLAY_WORKER_COST.items() if key != "service"}  # --no-service
    png_path = tmp_path / "figure.png"
    plot(write(tmp_path, document), png_path)
    png_size(png_path)


@pytest.mark.parametrize("json_path", sorted(FIGURES.glob("*.json")), ids=lambda path: path.stem)
def test_each_committed_figure_is_drawn_again_from_its_json(json_path: Path, tmp_path: Path) -> None:
    png_path = tmp_path / "figure.png"
    plot(json_path, png_path)
    assert png_size(png_path) == png_size(json_path.with_suffix(".png"))


def test_the_command_writes_beside_the_json_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = write(tmp_path, DOCUMENTS["http_lookup"])
    assert main([str(json_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "http_lookup.png")
    png_size(tmp_path / "http_lookup.png")


def test_a_benchmark_without_a_plot_is_an_error_naming_those_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = write(tmp_path, {"benchmark": "no_such_benchmark"})
    assert main([str(json_path)]) == 2
    error = capsys.readouterr().err
    assert "no_such_benchmark" in error
    assert "tuning_quality" in error
    assert not (tmp_path / "no_such_benchmark.png").exists()


def test_run_as_a_script_it_finds_its_plots(tmp_path: Path) -> None:
    """``python benchmarks/plot.py``, as the docs run it, from outside the repository root."""
    json_path = write(tmp_path, DOCUMENTS["dashboard"])
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot.py"), str(json_path), "-o", str(tmp_path / "out.png")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    png_size(tmp_path / "out.png")


@pytest.mark.parametrize(
    ("shape_key", "label"),
    [
        ("m=512,n=512,k=512", "512×512×512"),
        ("n=4194304", "2^22"),
        ("n=300007", "300007"),
        ("rows=2048,cols=1000", "2048×1000"),
        ("batch=1,heads=8,seq_q=1024,seq_kv=1024,head_dim=64,causal=1", "1×8×1024×1024×64 causal"),
        ("batch=1,heads=4,seq_q=256,seq_kv=256,head_dim=64,causal=0", "1×4×256×256×64"),
        (
            "batch=1,heads=8,kv_heads=2,seq_q=512,seq_kv=1024,head_dim=64,causal=2,mask=1",
            "1×8×512×1024×64 kv 2 causal bottom-right masked",
        ),
        ("batch=1,heads=8,kv_heads=8,seq_q=64,seq_kv=64,head_dim=64,causal=0,mask=0", "1×8×64×64×64"),
        ("m=512,n=1536,k=512,a_transposed=0,b_transposed=1", "512×1536×512 B^T"),
    ],
)
def test_shape_labels_are_short(shape_key: str, label: str) -> None:
    assert shape_label(shape_key) == label
