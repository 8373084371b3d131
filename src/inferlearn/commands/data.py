"""``inferlearn data list|fetch``: where datasets are, and download them with checksums."""
from __future__ import annotations

from ..data import DATASETS, describe, fetch, search_roots
from .common import check_data_dir


def register(sub) -> None:
    p = sub.add_parser("data", help="list or fetch datasets")
    dsub = p.add_subparsers(dest="data_command", required=True)
    lst = dsub.add_parser("list", help="show each dataset and where it was found, or why not")
    lst.add_argument("--data-dir", default=None)
    lst.set_defaults(func=run_list)
    fe = dsub.add_parser("fetch", help="download a dataset from its public mirrors and verify its checksums")
    fe.add_argument("name", help=", ".join(DATASETS))
    fe.add_argument("--data-dir", default=None, help="destination (default $INFERLEARN_DATA or the user cache)")
    fe.add_argument("--quiet", action="store_true")
    fe.set_defaults(func=run_fetch)


def run_list(args) -> int:
    check_data_dir(args.data_dir)
    print("search order: " + " → ".join(f"{label} {root}" for label, root in search_roots(args.data_dir)))
    for name in DATASETS:
        print(f"{name:14s} {describe(name, args.data_dir)}")
    return 0


def run_fetch(args) -> int:
    folder = fetch(args.name, args.data_dir, progress=not args.quiet)
    print(f"{args.name}: verified, in {folder}")
    return 0
