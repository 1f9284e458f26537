"""The documents of a local corpus for ``archlab-prepare``: JSONL (``.jsonl``, ``.jsonl.gz``), Parquet, or a
``datasets`` directory written by ``save_to_disk`` (its Arrow files read with pyarrow), given as a file,
a directory or a glob. ``open_corpus`` checks everything it can cheaply (the files, the format, the text
field, the document count) before a document is tokenised."""

from __future__ import annotations

import glob
import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from archlab.errors import ConfigError

FORMATS = ("auto", "text", "jsonl", "parquet", "datasets")
SUFFIXES = {".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".parquet": "parquet"}
# suffixes of files that are neither text nor a corpus format read here: auto refuses them rather than
# tokenising their bytes as text
NOT_TEXT = (".json", ".csv", ".tsv", ".arrow", ".gz", ".zst", ".bz2", ".xz", ".zip", ".tar", ".bin", ".npy")
DATASET_FILES = ("state.json", "dataset_info.json")  # what save_to_disk writes beside its Arrow files
BATCH_ROWS = 1024  # rows per Arrow/Parquet batch read


def suffix(path: Path) -> str:
    """``.jsonl.gz`` for a gzipped JSONL file, else the last suffix, lower-cased."""
    name = path.name.lower()
    return ".jsonl.gz" if name.endswith(".jsonl.gz") else path.suffix.lower()


@dataclass
class Corpus:
    """A checked corpus: its format, its files in reading order, the text field and its document count."""

    format: str
    files: list[Path]
    text_field: str
    documents: int

    def texts(self) -> Iterator[str]:
        """Every document's text, in order: file by file, record by record."""
        for file in self.files:
            yield from READERS[self.format](file, self.text_field)


def input_format(path: str, fmt: str) -> tuple[str, list[Path]]:
    """The format and the files of ``input``: a file, a directory (a ``datasets`` one, or one of JSONL or
    Parquet files, searched recursively) or a glob; ``format=auto`` goes by the names."""
    if fmt not in FORMATS:
        raise ConfigError("format", fmt, f"one of {list(FORMATS)}")
    given = Path(path).expanduser()
    if given.is_dir():
        if (given / "dataset_dict.json").is_file():
            splits = json.loads((given / "dataset_dict.json").read_text()).get("splits", [])
            raise ConfigError(
                "input", path, f"a datasets directory of one split: give input={path}/<split> (it holds {splits})"
            )
        if any((given / name).is_file() for name in DATASET_FILES):
            return _agree(path, fmt, "datasets"), [given]
        files = sorted(p for p in given.rglob("*") if p.is_file() and suffix(p) in SUFFIXES)
    elif given.exists() or not any(c in path for c in "*?["):
        if not given.is_file():
            raise ConfigError("input", path, "an existing text file, corpus file, directory or glob (no file there)")
        if fmt in ("auto", "text") and (fmt == "text" or suffix(given) not in SUFFIXES):
            if fmt == "auto" and suffix(given) in NOT_TEXT:
                raise ConfigError(
                    "format",
                    fmt,
                    f"a format that reads {given.name}: {suffix(given)} is none archlab-prepare knows by its name "
                    "(text, .jsonl, .jsonl.gz, .parquet, a datasets directory); name one with format=",
                )
            return "text", [given]
        files = [given]
    else:
        files = sorted(Path(p) for p in glob.glob(str(given), recursive=True) if Path(p).is_file())
        if not files:
            raise ConfigError("input", path, "a glob that matches files (it matches none)")
    if not files:
        raise ConfigError(
            "input",
            path,
            "a text file, a corpus file, a datasets directory, or a directory or glob of .jsonl, .jsonl.gz or .parquet "
            f"files (a {'directory' if given.is_dir() else 'glob'} there), holding none of these",
        )
    if fmt in ("jsonl", "parquet"):
        return fmt, files
    if fmt != "auto":
        raise ConfigError(
            "format", fmt, f"auto, jsonl or parquet for {path} (not a single file, nor a datasets directory)"
        )
    kinds = {SUFFIXES.get(suffix(p)) for p in files}
    found = kinds.pop()
    if kinds or found is None:
        names = sorted({suffix(p) or p.name for p in files})
        raise ConfigError(
            "format",
            fmt,
            f"jsonl or parquet, named with format= where the files' names do not say: {path} holds {names}",
        )
    return found, files


def _agree(path: str, fmt: str, found: str) -> str:
    if fmt not in ("auto", found):
        raise ConfigError("format", fmt, f"auto or {found}: {path} is {found}")
    return found


def _jsonl(file: Path) -> Iterator[tuple[int, str]]:
    """The lines of a JSONL file (gunzipped for ``.jsonl.gz``), numbered from 1; one ConfigError naming the
    file and the line for bytes that are not UTF-8, and the file for gzip data that is cut short or not gzip."""
    gzipped = suffix(file) == ".jsonl.gz"
    number = 0
    try:
        with gzip.open(file, "rb") if gzipped else file.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                yield number, line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            "input", str(file), f"UTF-8 text (line {number}: byte {err.start + 1} of the line is not UTF-8)"
        ) from None
    except gzip.BadGzipFile as err:
        raise ConfigError("input", str(file), f"a gzip file, as its name says ({err})") from None
    except (EOFError, zlib.error) as err:
        raise ConfigError(
            "input", str(file), f"a whole gzip file (after line {number}: {err}; truncated or damaged?)"
        ) from None


def _text(value: Any, file: Path, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise ConfigError("text_field", field, f"a field holding text in every record: {file} {where} holds {value!r}")
    return value


def jsonl_texts(file: Path, field: str) -> Iterator[str]:
    for number, line in _jsonl(file):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError("input", str(file), f"JSON lines (line {number}: {err})") from None
            if not isinstance(record, dict) or field not in record:
                has = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ConfigError("text_field", field, f"a field of every record: line {number} of {file} has {has}")
            yield _text(record[field], file, f"line {number}", field)


def _batches(file: Path, fmt: str, field: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        yield from pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, columns=[field])
    else:
        with pa.memory_map(str(file)) as source:
            yield from pa.ipc.open_stream(source)


def arrow_texts(fmt: str) -> Any:
    def texts(file: Path, field: str) -> Iterator[str]:
        row = 0
        for batch in _batches(file, fmt, field):
            for value in batch.column(field).to_pylist():
                row += 1
                yield _text(value, file, f"row {row}", field)

    return texts


READERS = {"jsonl": jsonl_texts, "parquet": arrow_texts("parquet"), "datasets": arrow_texts("datasets")}


def dataset_files(directory: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` directory, in the order its ``state.json`` lists them."""
    state = directory / "state.json"
    if state.is_file():
        return [directory / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    return sorted(directory.glob("*.arrow"))


def _columns(file: Path, fmt: str) -> tuple[dict[str, Any], int]:
    """The column types by name and the row count of a Parquet or Arrow file, from its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            parquet = pq.ParquetFile(file)
            schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
        else:
            with pa.memory_map(str(file)) as source:
                reader = pa.ipc.open_stream(source)
                schema, rows = reader.schema, sum(batch.num_rows for batch in reader)
    except (pa.ArrowException, OSError) as err:
        raise ConfigError("input", str(file), f"a {fmt} file pyarrow reads ({err})") from None
    return {name: schema.field(name).type for name in schema.names}, rows


def _check_jsonl(files: list[Path], field: str) -> int:
    """The records of the JSONL files (their non-blank lines); the first record must hold ``field``."""
    count, first = 0, None
    for file in files:
        for _, line in _jsonl(file):
            if line.strip():
                count += 1
                if first is None:
                    try:
                        first = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ConfigError("input", str(file), f"JSON lines (its first record: {err})") from None
                    has = sorted(first) if isinstance(first, dict) else type(first).__name__
                    if not isinstance(first, dict) or field not in first:
                        raise ConfigError(
                            "text_field", field, f"a field of the records: the first record of {file} has {has}"
                        )
                    _text(first[field], file, "(its first record)", field)
    return count


def open_corpus(path: str, fmt: str, field: str) -> Corpus:
    """The corpus ``input`` names, checked: its format, a text field in its records, at least one document."""
    fmt, files = input_format(path, fmt)
    if fmt == "text":
        return Corpus(fmt, files, field, 1)
    if fmt == "datasets":
        files = dataset_files(files[0])
    if fmt == "jsonl":
        documents = _check_jsonl(files, field)
    else:
        try:
            import pyarrow
        except ImportError:
            raise ConfigError("format", fmt, "jsonl or text here: reading Parquet and Arrow needs pyarrow "
                              "(pip install 'archlab[corpus]')") from None  # fmt: skip
        documents = 0
        for file in files:
            types, rows = _columns(file, fmt)
            if field not in types:
                raise ConfigError("text_field", field, f"a column of {file}: it has {list(types)}")
            if not (pyarrow.types.is_string(types[field]) or pyarrow.types.is_large_string(types[field])):
                raise ConfigError("text_field", field, f"a column of text: in {file} it holds {types[field]}")
            documents += rows
    if documents == 0:
        raise ConfigError("input", path, f"a corpus with documents ({len(files)} {fmt} file(s), no records)")
    return Corpus(fmt, files, field, documents)
