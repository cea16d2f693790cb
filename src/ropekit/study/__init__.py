"""Controlled studies: one base model, many context-extension methods, the same evaluations at several lengths.

:mod:`.store` keeps everything a study produces in one SQLite file (``DIR/study.sqlite``) that several
workers may write at once; :mod:`.stats` aggregates it (perplexity, accuracy, speed ratios, Kendall τ,
the ranking); :mod:`.report` turns it into ``DIR/report/`` (a self-contained HTML page, Markdown, JSON
and PNG figures).
"""

from __future__ import annotations

from .store import (
    DB_NAME,
    Piece,
    StoreRecordWriter,
    StudyStore,
    open_study,
    parse_piece_id,
    sample_key,
)

__all__ = ["DB_NAME", "Piece", "StoreRecordWriter", "StudyStore", "open_study", "parse_piece_id", "sample_key", "write_report"]


def write_report(study_dir, out_dir=None):
    """Write ``DIR/report/`` (see :func:`ropekit.study.report.write_report`)."""
    from .report import write_report as _write

    return _write(study_dir, out_dir)
