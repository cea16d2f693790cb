"""Record where a study's pieces computed, for pieces finished before ropekit kept it (``placement:PIECE`` in the
study's manifest, :meth:`ropekit.study.store.StudyStore.placements`): a study copied back from a lent machine whose
run log says where it ran.

    python scripts/backfill_placement.py DB --until 2026-11-27T23:00 --device cuda:0 --dtype bfloat16 \
        --attn sdpa --hardware "NVIDIA H200" [--train-dtype float32 --train-precision bf16]

Every finished piece of DB that recorded no placement and finished at or before ``--until`` (ISO 8601, UTC) gets
the one given; training pieces get ``--train-dtype``/``--train-precision`` (their weights and autocast) instead of
``--dtype``/``--attn``. Pieces that recorded their own placement are never changed. With ``--unstamped-samples``,
every evaluation sample that carries no ``computed_on`` gets the evaluation placement too, whatever its piece's
state: say so only when every such sample came from that machine (samples keep no time of their own), e.g. a
study copied back from a lease whose unfinished pieces will be resumed elsewhere. Prints what it set.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from ropekit.errors import RopekitError
from ropekit.study.store import PLACEMENT_KEY, StudyStore


def _instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--until", required=True, help="pieces finished at or before this moment (ISO 8601, UTC)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--attn", default=None)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--train-dtype", default="float32")
    parser.add_argument("--train-precision", default=None)
    parser.add_argument("--unstamped-samples", action="store_true",
                        help="also stamp every sample without computed_on (all came from that machine)")
    args = parser.parse_args(argv)
    try:
        until = _instant(args.until)
    except ValueError:
        print(f"--until {args.until!r} is not an ISO 8601 moment (e.g. 2026-11-27T23:00)", file=sys.stderr)
        return 2
    try:
        store = StudyStore(args.db, create=False)
    except RopekitError as err:
        print(f"{err.problem} ({err.fix})" if err.fix else err.problem, file=sys.stderr)
        return 2
    with store:
        known = store.placements()
        chosen = {}
        for p in store.pieces():
            if p["status"] != "done" or p["id"] in known or not p["finished"] or _instant(p["finished"]) > until:
                continue
            if p["kind"] == "train":
                where = {"device": args.device, "dtype": args.train_dtype, "hardware": args.hardware}
                if args.train_precision:
                    where["precision"] = args.train_precision
            else:
                where = {"device": args.device, "dtype": args.dtype, "hardware": args.hardware}
                if args.attn:
                    where["attn"] = args.attn
            chosen[PLACEMENT_KEY + p["id"]] = where
        if chosen:
            store.set_manifest(chosen)
        stamped = 0
        if args.unstamped_samples:
            stamp = {"device": args.device, "dtype": args.dtype, "hardware": args.hardware}
            if args.attn:
                stamp["attn"] = args.attn
            with store._write() as db:  # one transaction: every unstamped sample or none
                stamped = db.execute("UPDATE samples SET record = json_set(record, '$.computed_on', json(?)) "
                                     "WHERE json_extract(record, '$.computed_on') IS NULL",
                                     (json.dumps(stamp),)).rowcount
    for key, where in chosen.items():
        print(f"{key[len(PLACEMENT_KEY):]}: {where}")
    print(f"{len(chosen)} piece(s) given a placement" + (f", {stamped} sample(s) stamped" if args.unstamped_samples
                                                            else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
