"""What lookup would shortlist at shapes nobody tuned, from a cache file, without its GPU:
which shapes would be estimated from seeds alone (no measured config among the few timed).

    python benchmarks/shortlists.py --cache cache/nvidia-h200-vulkan-0c11ccbbcb01.json

The ranking is lookup's own (lookup._ranked, predict.shortlist) on a stand-in of the file's
device: its fingerprint (its count of multiprocessors; the files of GPUs of its kind beside
it are borrowed from), every feature, and the local adapter's limits with the H200's four
that matter here (FACTS: workgroup storage 49152, 1024 invocations, 2 GiB bindings and
4 GiB buffers). Nothing is compiled or timed: the
estimate times the shortlist at the shape, and a shortlist of seeds only is one where
nothing measured on the device informs it. Prints one line per such shape, then a count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from autotune import cache, predict  # noqa: E402
from autotune.device import Fingerprint, get_gpu  # noqa: E402
from autotune.lookup import SHORTLIST, _ranked  # noqa: E402
from autotune.problem import Problem  # noqa: E402

H200_LIMITS = {
    "max-compute-workgroup-storage-size": 49152,
    "max-compute-invocations-per-workgroup": 1024,
    "max-storage-buffer-binding-size": 2147483644,
    "max-buffer-size": 4292870144,
}
TOKENS = (1, 3, 7, 32, 100, 333, 1000)
WIDTHS = ((5120, 5120), (13824, 5120), (3072, 8192))  # linear layers no shipped entry has
QUANTIZED = (("q4g128", "none"), ("q4g128", "q8"), ("q8", "q8"), ("q4g32", "none"))


def problems() -> list[Problem]:
    """Tokens x widths, f32 and f16: nn and nt unquantized, and each quantized format."""
    found = []
    for M, (N, K), dtype in itertools.product(TOKENS, WIDTHS, ("f32", "f16")):
        found += [Problem(M, N, K, dtype, layout) for layout in ("nn", "nt")]
        found += [Problem(M, N, K, dtype, "nt", weights=w, activations=a) for w, a in QUANTIZED]
    return found


def stand_in(path: Path) -> tuple[cache.DeviceCache, SimpleNamespace, dict]:
    """The file's store, a stand-in of its device, and the limits it is ranked within."""
    header = cache.read_header(path)
    store = cache.DeviceCache.at(path, header)
    device = SimpleNamespace(
        fingerprint=Fingerprint(**header["fingerprint"]),  # its kin are borrowed from too
        has_every_feature=True,  # no kernel is refused for a feature
        limited_as=lambda portable: None,
    )
    return store, device, dict(get_gpu().limits) | H200_LIMITS


def seeds_only(path: Path, checks: bool = False) -> list[tuple[Problem, list[str]]]:
    """(problem, the shortlist's templates) for each problem whose shortlist has no
    measured config."""
    store, device, limits = stand_in(path)
    starved = []
    for problem in problems():
        ranked = _ranked(problem, checks, [store], device, limits)
        shortlist = predict.shortlist(ranked, SHORTLIST)
        if not any(c.entry for c in shortlist):
            starved.append((problem, [c.config.template for c in shortlist]))
    return starved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, type=Path, help="a device's cache file")
    parser.add_argument("--checks", choices=("on", "off"), default="off", help="the mode")
    args = parser.parse_args(argv)
    starved = seeds_only(args.cache, args.checks == "on")
    for problem, templates in starved:
        print(f"seeds only: {problem}: {', '.join(templates)}")
    print(json.dumps({"problems": len(problems()), "seeds_only": len(starved)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
