"""The README's quickstart picture: ``geolens.attribute(...).plot()`` on SmolLM2-135M. By default it
is written outside docs/ (geolens-runs/quickstart.png); the published copy that the README and the
docs site show is made with

    python scripts/quickstart_figure.py --out docs/images/quickstart.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import geolens

TEXT = "The capital of France is"  # the README's quickstart sentence
METHODS = ["contribution_flow", "alti", "integrated_gradients"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="geolens-runs/quickstart.png", help="where to write the PNG")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    att = geolens.attribute("smollm2-135m", TEXT, method=METHODS)
    att.plot().savefig(args.out, dpi=110, bbox_inches="tight")
    print(att)
    print(att.to_dataframe().round(4).to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
