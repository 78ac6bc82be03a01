# Sourced by all.sh and quantized.sh: what both take and set up before their tables.
#
#   source "$here/_args.sh" "$@"
#
# Reads [--quick] OUT_DIR (exit 2 with the caller's usage line otherwise) and sets
# py (the interpreter: $PYTHON, default python), rounds (3, or 1 with --quick, which also
# exports AUTOTUNE_BENCH_QUICK=1) and out (OUT_DIR, created).
py="${PYTHON:-python}"
rounds=3
if [[ "${1:-}" == "--quick" ]]; then
    export AUTOTUNE_BENCH_QUICK=1
    rounds=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: benchmarks/$(basename "$0") [--quick] OUT_DIR" >&2
    exit 2
fi
out="$1"
mkdir -p "$out"
# lookup keeps what it estimates at a shape without an entry in $AUTOTUNE_CACHE (in a
# checkout: cache/, the shipped file): a folder of this run's own, unless one is given,
# so that every run starts from the shipped entries alone.
if [[ -z "${AUTOTUNE_CACHE:-}" ]]; then
    AUTOTUNE_CACHE="$(mktemp -d)"
    export AUTOTUNE_CACHE
fi
