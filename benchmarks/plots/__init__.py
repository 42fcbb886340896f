"""The benchmarks' main figures, one module per family of benchmarks.

Each plot function takes the JSON document a benchmark printed and returns a matplotlib
:class:`~matplotlib.figure.Figure`; ``benchmarks/plot.py`` picks one by the document's
``benchmark`` field and writes it as a PNG. Figures are drawn off-screen (Agg), never shown.
"""

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or wanted
