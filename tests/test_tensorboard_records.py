"""The event file's record framing: google-crc32c's C CRC-32C when installed, tensorboard's own
writer otherwise, byte for byte the same."""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path

import pytest

from jupyter_trainmate.runtime import tensorboard as tb


class _Kept(io.BytesIO):
    def close(self) -> None:  # keep the bytes readable after the writer closes the file
        pass


def _framed(writer_of: object, records: list[bytes]) -> bytes:
    file = _Kept()
    writer = writer_of(file)  # type: ignore[operator]
    for record in records:
        writer.write(record)
    writer.flush()
    writer.close()
    return file.getvalue()


def test_the_c_crc_frames_records_as_tensorboard_does() -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    crc32c = tb.c_crc32c()
    assert crc32c is not None, "google-crc32c (C) is a test dependency: the fast path must run"
    rng = random.Random(5)
    records = [rng.randbytes(n) for n in (0, 1, 7, 8, 9, 64, 255, 256, 1000, 4099)]
    records += [rng.randbytes(rng.randrange(0, 600)) for _ in range(50)]
    assert isinstance(tb.record_writer(_Kept()), tb._Records)
    assert _framed(tb.record_writer, records) == _framed(RecordWriter, records)


def test_without_google_crc32c_tensorboards_writer_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    assert tb.c_crc32c() is None
    assert isinstance(tb.record_writer(_Kept()), RecordWriter)


def test_an_event_file_written_with_the_c_crc_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    events = tb.EventFile(tmp_path)
    events.scalar("train/loss", 0.5, 3)
    events.text("run/summary", "finished", 3)
    events.close()
    (path,) = tmp_path.iterdir()
    read = list(EventFileLoader(str(path)).Load())  # checks each record's CRCs
    assert [e.file_version for e in read[:1]] == ["brain.Event:2"]
    assert [e.step for e in read[1:]] == [3, 3]
    assert read[1].summary.value[0].tag == "train/loss"
