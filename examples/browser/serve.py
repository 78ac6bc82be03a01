"""The candidate-set demo: export a candidate set for one GEMM and serve the demo page.

    python examples/browser/serve.py --shape 256x256x256 --candidates 4

then open the printed address in a browser with WebGPU. The page times the candidates on
that GPU, keeps the fastest (stored, so a reload reuses it) and checks its result. The
bundle goes to --out (default examples/browser/bundles, which git ignores).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
from pathlib import Path

import autotune
from autotune.arguments import ArgumentError
from autotune.problem import parse_shape

HERE = Path(__file__).resolve().parent


class DemoHandler(http.server.SimpleHTTPRequestHandler):
    """This folder's files, and /bundles/ from the bundle folder; quiet."""

    def __init__(self, *args, bundles: Path, **kwargs):
        self.bundles = bundles
        super().__init__(*args, directory=str(HERE), **kwargs)

    def translate_path(self, path: str) -> str:
        if path.startswith("/bundles/"):
            return str(self.bundles / Path(path.split("?")[0]).name)
        return super().translate_path(path)

    def log_message(self, *args) -> None:
        pass


def export_set(shape: str, dtype: str, candidates: int, out: Path) -> str:
    """Export the candidate set for `shape` into `out`, named in out/index.json; its name."""
    p = parse_shape(shape, dtype)
    # portable: within WebGPU's default limits, so it runs on any visitor's GPU
    kernel = autotune.lookup(p.M, p.N, p.K, p.dtype, portable=True)
    paths = autotune.export(kernel, out, candidates=candidates)
    name = paths["js"].stem
    (out / "index.json").write_text(json.dumps({"bundle": name}) + "\n")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="256x256x256", help="MxNxK (default 256x256x256)")
    parser.add_argument("--dtype", default="f32", choices=("f32", "f16"))
    parser.add_argument("--candidates", type=int, default=4, help="at most this many (4)")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (8000)")
    parser.add_argument("--out", type=Path, default=HERE / "bundles", help="the bundle folder")
    args = parser.parse_args(argv)
    try:
        name = export_set(args.shape, args.dtype, args.candidates, args.out)
    except ArgumentError as error:
        print(f"serve.py: {error}", file=sys.stderr)
        return 2
    handler = functools.partial(DemoHandler, bundles=args.out.resolve())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"{name}: serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
