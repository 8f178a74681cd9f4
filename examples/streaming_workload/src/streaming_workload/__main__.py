"""``python -m streaming_workload write DIR [--examples N] [--shard-size N]``: write a synthetic shard folder."""

from __future__ import annotations

import argparse

from streaming_workload.shards import write_shards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streaming_workload")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write a synthetic shard folder")
    write.add_argument("folder")
    write.add_argument("--examples", type=int, default=4096)
    write.add_argument("--shard-size", type=int, default=512)
    args = parser.parse_args(argv)
    folder = write_shards(args.folder, examples=args.examples, shard_size=args.shard_size)
    print(f"wrote {args.examples} training examples in shards of {args.shard_size} to {folder}")


if __name__ == "__main__":
    main()
