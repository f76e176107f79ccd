"""The text of a Pulseq file (versions 1.4 and 1.5) as checked numeric tables.

This module knows the file format only: sections, columns, units, shapes and their compression. What
the events mean for a simulation is `_pulseq.py`'s business; where gradients take k-space is
`_pulseq_kspace.py`'s.

Every table is parsed in one pass of `numpy.fromstring` over its rows, with a line-by-line pass only to
name the first bad line when that fails; a 100k-block file parses in well under a second. Every
failure is a `ValueError` that names the section and the line (1-based) where the file goes wrong:
nothing is skipped, clamped or read in part. The file must end with a line break (a file cut mid-line
would otherwise read as a shorter number), and a signed file (an md5 `[SIGNATURE]`) must match its
signature.
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from ._pulseq_arrays import decode_shape, unique_rows

__all__ = ["PulseqFile", "EventTable", "parse_pulseq_text", "decode_shape", "unique_rows", "MAX_SHAPE_SAMPLES"]

#: The most samples one shape may declare (134 MB of float64 decoded). A declaration past it is refused
#: before anything is allocated: the longest real shapes (a 100 ms pulse on a 1 us raster) hold 1e5.
MAX_SHAPE_SAMPLES = 1 << 24

#: Columns after the id, per section and version (major, minor).
_COLUMNS = {
    ("BLOCKS", 4): ("duration", "rf", "gx", "gy", "gz", "adc", "ext"),
    ("BLOCKS", 5): ("duration", "rf", "gx", "gy", "gz", "adc", "ext"),
    ("RF", 4): ("amplitude_hz", "mag_id", "phase_id", "time_id", "delay_us", "freq_hz", "phase_rad"),
    ("RF", 5): ("amplitude_hz", "mag_id", "phase_id", "time_id", "center_us", "delay_us", "freq_ppm",
                "phase_ppm", "freq_hz", "phase_rad"),  # and the use, a letter
    ("GRADIENTS", 4): ("amplitude_hz_per_m", "shape_id", "time_id", "delay_us"),
    ("GRADIENTS", 5): ("amplitude_hz_per_m", "first_hz_per_m", "last_hz_per_m", "shape_id", "time_id", "delay_us"),
    ("TRAP", 4): ("amplitude_hz_per_m", "rise_us", "flat_us", "fall_us", "delay_us"),
    ("TRAP", 5): ("amplitude_hz_per_m", "rise_us", "flat_us", "fall_us", "delay_us"),
    ("ADC", 4): ("num", "dwell_ns", "delay_us", "freq_hz", "phase_rad"),
    ("ADC", 5): ("num", "dwell_ns", "delay_us", "freq_ppm", "phase_ppm", "freq_hz", "phase_rad", "phase_id"),
    ("EXTENSIONS", 4): ("type", "ref", "next_id"),
    ("EXTENSIONS", 5): ("type", "ref", "next_id"),
}
#: Columns that hold ids or counts: whole numbers >= 0.
_WHOLE = {"duration", "rf", "gx", "gy", "gz", "adc", "ext", "mag_id", "phase_id", "time_id", "shape_id", "num",
          "type", "ref", "next_id"}
_SECTIONS = ("VERSION", "DEFINITIONS", "BLOCKS", "RF", "GRADIENTS", "TRAP", "ADC", "EXTENSIONS", "SHAPES",
             "SIGNATURE", "DELAYS")
#: RF uses of a 1.5 file, by letter.
RF_USE_LETTERS = "erispou"  # excitation, refocusing, inversion, saturation, preparation, other, undefined

_HEADER = re.compile(r"^(?:\[([^\]\n]*)\]|extension[ \t]+(\S+)[ \t]+(\S+))[ \t]*\r?$", re.M)


@dataclass
class EventTable:
    """One event section: `ids` (int64, file order), `values` (rows, columns) float64, the file line
    of each row, and (RF of 1.5 only) the use letter of each row."""

    section: str
    columns: tuple
    ids: np.ndarray
    values: np.ndarray
    lines: np.ndarray
    uses: list | None = None
    _order: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[self._order]
        twice = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if twice.size:
            first, second = self._order[twice[0]], self._order[twice[0] + 1]
            raise ValueError(f"[{self.section}] defines id {self.ids[first]} twice: line {self.lines[first]} and "
                             f"line {self.lines[second]}")

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.columns.index(name)]

    def rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index per id, whether the id is defined); ids not defined get row 0."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0:
            return np.zeros(ids.shape, dtype=np.int64), np.zeros(ids.shape, dtype=bool)
        sorted_ids = self.ids[self._order]
        at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
        found = sorted_ids[at] == ids
        return np.where(found, self._order[at], 0), found


@dataclass
class Shape:
    """A `[SHAPES]` entry: its declared length, its samples as written (maybe compressed), its line."""

    num_samples: int
    packed: np.ndarray
    line: int


@dataclass
class PulseqFile:
    version: tuple
    definitions: dict  # name -> (text of the value, line)
    blocks: np.ndarray  # (N, 8) int64: id, duration (block rasters), rf, gx, gy, gz, adc, ext
    block_lines: np.ndarray
    tables: dict  # section name -> EventTable (RF, GRADIENTS, TRAP, ADC, EXTENSIONS present in the file)
    shapes: dict  # id -> Shape
    extensions: list  # the names of the file's extension specifications, in file order
    _decoded: dict = field(default_factory=dict, repr=False)

    # -- definitions ------------------------------------------------------------------------------
    def definition_number(self, name: str, default: float | None = None, *, positive: bool = True) -> float | None:
        """The number a definition gives, `default` when the file has none; ValueError naming the line
        when its value is not a (positive) finite number."""
        if name not in self.definitions:
            return default
        text, line = self.definitions[name]
        try:
            value = float(text.split()[0]) if len(text.split()) == 1 else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (positive and value <= 0):
            kind = "a positive number" if positive else "a number"
            raise ValueError(f"[DEFINITIONS] line {line}: {name} must be {kind}, got {text!r}")
        return value

    def definition_index(self, name: str, *, minimum: int) -> int | None:
        """A whole-number definition (TRSize, TRRef), None when the file has none."""
        if name not in self.definitions:
            return None
        text, line = self.definitions[name]
        value = self.definition_number(name, positive=False)
        if value != round(value) or value < minimum or value > 2**53:
            raise ValueError(f"[DEFINITIONS] line {line}: {name} must be a whole number >= {minimum}, got {text!r}")
        return int(value)

    # -- shapes ----------------------------------------------------------------------------------
    def shape(self, shape_id: int, *, user: str) -> np.ndarray:
        """The decoded samples (float64) of shape `shape_id`; `user` names who asks, for the error."""
        shape_id = int(shape_id)
        if shape_id not in self._decoded:
            shape = self.shapes.get(shape_id)
            if shape is None:
                where = "the file has no [SHAPES] section" if not self.shapes else "[SHAPES] does not define it"
                raise ValueError(f"{user} uses shape {shape_id}, but {where}")
            try:
                samples = decode_shape(shape.packed, shape.num_samples)
            except ValueError as error:
                raise ValueError(f"[SHAPES] shape_id {shape_id} (line {shape.line}): {error}") from None
            samples.flags.writeable = False
            self._decoded[shape_id] = samples
        return self._decoded[shape_id]


# -- parsing ----------------------------------------------------------------------------------------
def parse_pulseq_text(raw: bytes) -> PulseqFile:
    """A `PulseqFile` from the bytes of a `.seq` file; ValueError naming the line where it goes wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ValueError(f"line {line} is not text (byte {error.start} is not UTF-8): a Pulseq file is plain "
                         "text") from None
    if not text.strip():
        raise ValueError("the file is empty: a Pulseq file has [VERSION], [DEFINITIONS] and [BLOCKS] sections")
    if not text.endswith("\n"):
        last = text.rsplit("\n", 1)[-1]
        raise ValueError(f"the file ends mid-line (line {text.count(chr(10)) + 1}, {last[:40]!r}) with no line "
                         "break: it looks cut short; a complete Pulseq file ends with a line break")
    sections = _split_sections(text)
    _check_signature(raw, text, sections)
    version = _read_version(sections)
    minor = version[1]
    definitions = _read_definitions(sections.get("DEFINITIONS"))
    if "DELAYS" in sections:
        raise ValueError(f"[DELAYS] (line {sections['DELAYS'][1] - 1}) belongs to Pulseq 1.3 and older; a "
                         f"{version[0]}.{version[1]} file gives each block its duration instead")
    if "BLOCKS" not in sections:
        raise ValueError("the file has no [BLOCKS] section: there is no sequence to read")
    blocks, block_lines = _read_table("BLOCKS", sections["BLOCKS"], _COLUMNS["BLOCKS", minor], whole=True)
    tables = {}
    for name in ("RF", "GRADIENTS", "TRAP", "ADC", "EXTENSIONS"):
        if name in sections:
            columns = _COLUMNS[name, minor]
            uses = [] if (name, minor) == ("RF", 5) else None
            values, lines = _read_table(name, sections[name], columns, letters=uses, whole=name == "EXTENSIONS")
            tables[name] = EventTable(name, columns, values[:, 0].astype(np.int64), values[:, 1:], lines, uses)
    shapes = _read_shapes(sections.get("SHAPES"))
    extensions = [name for name in sections.get("extensions", ())]
    file = PulseqFile(version, definitions, blocks, block_lines, tables, shapes, extensions)
    _check_block_ids(file)
    return file


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _split_sections(text: str) -> dict:
    """{name: (body, line of the body's first line)} and "extensions": the extension names, in order.

    Headers are found with `str.find` (a regex over every line start of a long file costs ~0.1 s)."""
    starts = [0] if text.startswith(("[", "extension")) else []
    for marker in ("\n[", "\nextension"):
        at = text.find(marker)
        while at >= 0:
            starts.append(at + 1)
            at = text.find(marker, at + 1)
    found = []
    for start in sorted(starts):
        match = _HEADER.match(text, start)
        if match is not None:
            found.append(match)
        elif text.startswith("[", start):
            line = _line_of(text, start)
            raise ValueError(f"line {line}: {text[start:text.find(chr(10), start)][:40]!r} is not a section header "
                             "([NAME] alone on its line)")
    sections: dict = {"extensions": []}
    stray = _first_data_line(text[:found[0].start()] if found else text)
    if stray is not None:
        raise ValueError(f"line {stray[0]} ({stray[1][:40]!r}) comes before any section: a Pulseq file starts "
                         "with comments and then [VERSION]")
    line = 1
    for k, match in enumerate(found):
        body_start = match.end() + 1
        body_end = found[k + 1].start() if k + 1 < len(found) else len(text)
        line += text.count("\n", found[k - 1].start() if k else 0, match.start())
        if match.group(1) is None:  # an extension specification: its rows are not read
            sections["extensions"].append(match.group(2))
            continue
        name = match.group(1).strip()
        if name not in _SECTIONS:
            known = ", ".join(f"[{s}]" for s in _SECTIONS if s != "DELAYS")
            raise ValueError(f"line {line}: unknown section [{name}]; a Pulseq 1.4/1.5 file has {known} and "
                             "extension specifications")
        if name in sections:
            raise ValueError(f"line {line}: [{name}] appears twice (first at line {sections[name][1] - 1})")
        sections[name] = (text[body_start:body_end] if body_start <= body_end else "", line + 1)
    return sections


def _first_data_line(body: str, first_line: int = 1):
    for n, row in enumerate(body.split("\n"), first_line):
        stripped = row.strip()
        if stripped and not stripped.startswith("#"):
            return n, stripped
    return None


def _check_signature(raw: bytes, text: str, sections: dict) -> None:
    if "SIGNATURE" not in sections:
        return
    body, line = sections["SIGNATURE"]
    entries = {}
    for n, row in enumerate(body.split("\n"), line):
        parts = row.split()
        if parts and not parts[0].startswith("#"):
            entries[parts[0]] = (parts[1] if len(parts) > 1 else "", n)
    kind = entries.get("Type", ("", line))[0].lower()
    if kind != "md5":
        return  # a signature of another kind is not ours to check
    if "Hash" not in entries:
        raise ValueError(f"[SIGNATURE] (line {line - 1}) has no Hash line: the signature is cut short")
    signed = raw[:raw.index(b"\n[SIGNATURE]")] if not raw.startswith(b"[SIGNATURE]") else b""
    digest = hashlib.md5(signed).hexdigest()
    expected, hash_line = entries["Hash"]
    if digest != expected.lower():
        raise ValueError(f"[SIGNATURE] line {hash_line}: the file's md5 is {digest}, its signature says {expected}: "
                         "it was changed or cut after it was signed; if it was edited on purpose, delete its "
                         "[SIGNATURE] section")


def _read_version(sections: dict) -> tuple:
    if "VERSION" not in sections:
        raise ValueError("the file has no [VERSION] section: a Pulseq file says its format version (major, "
                         "minor, revision) first")
    body, line = sections["VERSION"]
    numbers = {}
    for n, row in enumerate(body.split("\n"), line):
        parts = row.split()
        if not parts or parts[0].startswith("#"):
            continue
        digits = re.match(r"\d+", parts[1]) if len(parts) == 2 else None
        if parts[0] not in ("major", "minor", "revision") or digits is None or parts[0] in numbers:
            raise ValueError(f"[VERSION] line {n}: expected 'major N', 'minor N' or 'revision N' once each, "
                             f"got {row.strip()[:60]!r}")
        numbers[parts[0]] = int(digits.group()[:9])
    missing = [k for k in ("major", "minor", "revision") if k not in numbers]
    if missing:
        raise ValueError(f"[VERSION] (line {line - 1}) does not give {', '.join(missing)}")
    version = (numbers["major"], numbers["minor"], numbers["revision"])
    if version[:2] not in ((1, 4), (1, 5)):
        raise ValueError(f"[VERSION] says {'.'.join(map(str, version))}; this reader takes Pulseq 1.4 and 1.5 "
                         "files (pypulseq reads older ones and writes them anew: Sequence.read, then write)")
    return version


def _read_definitions(section) -> dict:
    if section is None:
        return {}
    body, line = section
    definitions = {}
    for n, row in enumerate(body.split("\n"), line):
        stripped = row.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, _, value = stripped.partition(" ")
        if name in definitions:
            raise ValueError(f"[DEFINITIONS] line {n}: {name} is defined twice (first at line {definitions[name][1]})")
        definitions[name] = (value.strip(), n)
    return definitions


def _tokens_per_line(text: str) -> np.ndarray:
    """The number of whitespace-separated tokens on each line of `text`, counted on its bytes at once."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    white = (data == 32) | ((data >= 9) & (data <= 13))
    starts = np.flatnonzero(~white[1:] & white[:-1]) + 1
    if data.size and not white[0]:
        starts = np.concatenate([[0], starts])
    breaks = np.flatnonzero(data == 10)
    return np.bincount(np.searchsorted(breaks, starts), minlength=breaks.size + 1)


def _strip_comments(body: str) -> str:
    """`body` with its comment lines (first non-blank character '#') emptied, line breaks kept. Comments
    are few (the format notes before each section), so they are found with `str.find`, not a regex
    over every line of a long section."""
    at = body.find("#")
    if at < 0:
        return body
    parts, kept = [], 0
    while at >= 0:
        start = body.rfind("\n", 0, at) + 1
        end = body.find("\n", at)
        end = len(body) if end < 0 else end
        if not body[start:at].strip():
            parts.append(body[kept:start])
            kept = end
        at = body.find("#", end)
    parts.append(body[kept:])
    return "".join(parts)


def _read_table(section: str, part: tuple, columns: tuple, *, letters: list | None = None, whole: bool = False):
    """(values (rows, 1 + columns), file line of each row) of an event section: float64, or int64 when
    `whole` (every column an id or a count: a table of integers parses ~10x faster). `letters`, when a
    list, receives the last column of each row (the RF use of 1.5) instead of a number."""
    body, first_line = part
    clean = _strip_comments(body)
    width = len(columns) + 1
    if letters is not None:  # the RF table of 1.5: a letter ends each row
        rows = clean.split("\n")
        kept = []
        for n, row in enumerate(rows):
            parts = row.rsplit(None, 1)
            if not parts:
                kept.append("")
                continue
            if len(parts) != 2 or parts[1] not in RF_USE_LETTERS:
                raise ValueError(f"[{section}] line {first_line + n}: the last column is the pulse's use, one of the "
                                 f"letters {', '.join(RF_USE_LETTERS)}; got {row.strip()[:80]!r}")
            letters.append(parts[1])
            kept.append(parts[0])
        clean = "\n".join(kept)
    counts = _tokens_per_line(clean)
    rows = np.flatnonzero(counts)
    wrong = rows[counts[rows] != width]
    if wrong.size:
        n = int(wrong[0])
        layout = " ".join(("id",) + columns) + (" use" if letters is not None else "")
        row = clean.split("\n")[n].strip()
        raise ValueError(f"[{section}] line {first_line + n}: expected {width + (letters is not None)} columns "
                         f"({layout}), got {counts[n] + (letters is not None)}: {row[:80]!r}")
    values = _numbers(clean, rows.size * width, np.int64 if whole else np.float64)
    if values is None:
        _name_bad_token(section, clean, first_line, ("id",) + columns, whole)
    values = values.reshape(rows.size, width)
    lines = rows + first_line
    _check_values(section, values, lines, ("id",) + columns)
    return values, lines


def _numbers(text: str, expected: int, dtype=np.float64) -> np.ndarray | None:
    """Every whitespace-separated number in `text`, or None when one does not parse or the count is not
    `expected`."""
    if expected == 0:
        return np.zeros(0, dtype=dtype) if not text.strip() else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # older NumPy warns (DeprecationWarning) and returns what it read
        try:
            values = np.fromstring(text, dtype=dtype, sep=" ")
        except (ValueError, DeprecationWarning, OverflowError):
            return None
    return values if values.size == expected else None


def _name_bad_token(section: str, text: str, first_line: int, names: tuple, whole: bool) -> None:
    for n, row in enumerate(text.split("\n"), first_line):
        for column, token in zip(names, row.split(), strict=False):
            if not _NUMBER.match(token):
                raise ValueError(f"[{section}] line {n}: {column} is {token!r}, not a number")
            value = float(token)
            if whole and not (math.isfinite(value) and value == round(value) and 0 <= value <= 2**62):
                raise ValueError(f"[{section}] line {n}: {column} is {token!r}; it must be a whole number >= 0")
    raise ValueError(f"[{section}]: a number does not parse")  # not reached: some token above fails


def _check_values(section: str, values: np.ndarray, lines: np.ndarray, names: tuple) -> None:
    if values.dtype.kind == "i":
        bad = values < 0
    else:
        bad = ~np.isfinite(values)
    whole = np.array([name in _WHOLE or name == "id" for name in names])
    if whole.any() and values.dtype.kind == "f":
        ids = values[:, whole]
        # A gradient's time shape -1 is the 1.5 mark of a waveform sampled at half the raster.
        lowest = np.array([-1 if name == "time_id" and section == "GRADIENTS" else 0
                           for name, w in zip(names, whole, strict=True) if w])
        bad[:, whole] |= (ids != np.round(ids)) | (ids < lowest) | (ids > 2**53)
    if section != "BLOCKS" and values.shape[0]:
        bad[:, 0] |= values[:, 0] < 1
    if bad.any():
        row, column = np.argwhere(bad)[0]
        kind = "a whole number >= 0" if whole[column] else "a finite number"
        if names[column] == "time_id" and section == "GRADIENTS":
            kind = "a whole number >= -1"
        if column == 0 and section != "BLOCKS":
            kind = "a whole number >= 1"
        value = values[row, column].item()
        raise ValueError(f"[{section}] line {lines[row]}: {names[column]} is {value!r}; it must be {kind}")


_SHAPE_ID = re.compile(r"^[ \t]*shape_id\b", re.M)
#: A number as the file writes one (what numpy's parser takes; Python's float() also takes '1_0' and ' 1 ').
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$|[+-]?(?:nan|inf|infinity)$", re.I)


def _read_shapes(section) -> dict:
    """{id: Shape}. Each shape is 'shape_id N', 'num_samples M', then its values one per line."""
    if section is None:
        return {}
    body, first_line = section
    clean = _strip_comments(body)
    counts = _tokens_per_line(clean)
    markers = [m.start() for m in _SHAPE_ID.finditer(clean)]
    stray = _first_data_line(clean[:markers[0]] if markers else clean, first_line)
    if stray is not None:
        raise ValueError(f"[SHAPES] line {stray[0]}: expected 'shape_id N', got {stray[1][:60]!r}")
    shapes = {}
    line = first_line
    for k, start in enumerate(markers):
        end = markers[k + 1] if k + 1 < len(markers) else len(clean)
        line += clean.count("\n", markers[k - 1] if k else 0, start)
        head = clean[start:clean.find("\n", start) if "\n" in clean[start:end] else end].split()
        if len(head) != 2:
            raise ValueError(f"[SHAPES] line {line}: expected 'shape_id N', got {' '.join(head)[:60]!r}")
        shape_id = _whole(head[1], "shape_id", line, minimum=1)
        if shape_id in shapes:
            raise ValueError(f"[SHAPES] line {line}: shape_id {shape_id} is defined twice (first at line "
                             f"{shapes[shape_id].line})")
        # the lines of this shape after its marker: 'num_samples M', then one value per line
        segment = clean[start:end]
        rest = segment.split("\n")[1:]
        if segment.endswith("\n"):
            rest = rest[:-1]  # the empty tail after the last line break is the next marker's line
        local = np.zeros(len(rest), dtype=np.int64)
        below = counts[line - first_line + 1:line - first_line + 1 + len(rest)]
        local[:below.size] = below
        filled = np.flatnonzero(local)
        if filled.size == 0 or rest[filled[0]].split()[0] != "num_samples" or local[filled[0]] != 2:
            at = line + 1 + (int(filled[0]) if filled.size else 0)
            raise ValueError(f"[SHAPES] line {at}: shape_id {shape_id} must be followed by 'num_samples N'")
        count_line = line + 1 + int(filled[0])
        num_samples = _whole(rest[filled[0]].split()[1], "num_samples", count_line, minimum=1)
        if num_samples > MAX_SHAPE_SAMPLES:
            raise ValueError(f"[SHAPES] line {count_line}: shape_id {shape_id} declares {num_samples} samples; "
                             f"this reader takes at most {MAX_SHAPE_SAMPLES} per shape")
        data = filled[1:]
        if data.size == 0:
            raise ValueError(f"[SHAPES] line {count_line}: shape_id {shape_id} has no samples")
        wide = data[local[data] != 1]
        if wide.size:
            raise ValueError(f"[SHAPES] line {line + 1 + int(wide[0])}: shape_id {shape_id} has "
                             f"{rest[wide[0]].strip()[:40]!r} where one number per line belongs")
        if data.size > num_samples:
            raise ValueError(f"[SHAPES] line {line + 1 + int(data[num_samples])}: shape_id {shape_id} holds "
                             f"{data.size} values for num_samples {num_samples}; a compressed shape is never longer")
        text = "\n".join(rest[filled[0] + 1:])
        packed = _numbers(text, data.size)
        if packed is None or not np.isfinite(packed).all():
            for i in data:
                token = rest[i].strip()
                if not (_NUMBER.match(token) and math.isfinite(float(token))):
                    raise ValueError(f"[SHAPES] line {line + 1 + int(i)}: shape_id {shape_id} has "
                                     f"{token[:40]!r} where a finite number belongs")
            raise ValueError(f"[SHAPES] line {line}: shape_id {shape_id}: its samples do not parse as numbers")
        shapes[shape_id] = Shape(num_samples, packed, line)
    return shapes


def _whole(token: str, name: str, line: int, *, minimum: int) -> int:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value == round(value) and minimum <= value <= 2**53):
        raise ValueError(f"[SHAPES] line {line}: {name} must be a whole number >= {minimum}, got {token!r}")
    return int(value)


def _check_block_ids(file: PulseqFile) -> None:
    """Blocks are numbered 1, 2, ... in file order, and every event a block plays is defined."""
    blocks, lines = file.blocks, file.block_lines
    if blocks.shape[0] == 0:
        raise ValueError("[BLOCKS] holds no block: there is no sequence to read")
    wrong = np.flatnonzero(blocks[:, 0] != np.arange(1, blocks.shape[0] + 1))
    if wrong.size:
        i = wrong[0]
        raise ValueError(f"[BLOCKS] line {lines[i]}: block {blocks[i, 0]} comes where block {i + 1} belongs; "
                         "blocks are numbered 1, 2, ... in order")
    for column, section, what in ((2, ("RF",), "RF event"), (3, ("GRADIENTS", "TRAP"), "gradient"),
                                  (4, ("GRADIENTS", "TRAP"), "gradient"), (5, ("GRADIENTS", "TRAP"), "gradient"),
                                  (6, ("ADC",), "ADC event"), (7, ("EXTENSIONS",), "extension list")):
        ids = blocks[:, column]
        used = ids != 0
        found = np.zeros(ids.shape, dtype=bool)
        for name in section:
            if name in file.tables:
                found |= file.tables[name].rows_of(ids)[1]
        missing = np.flatnonzero(used & ~found)
        if missing.size:
            i = missing[0]
            have = [name for name in section if name in file.tables]
            where = (f"[{'] or ['.join(have)}] does not define it" if have
                     else f"the file has no [{'] or ['.join(section)}] section")
            raise ValueError(f"[BLOCKS] line {lines[i]}: block {i + 1} plays {what} {ids[i]}, but {where}")
    if "GRADIENTS" in file.tables and "TRAP" in file.tables:
        both = np.intersect1d(file.tables["GRADIENTS"].ids, file.tables["TRAP"].ids)
        if both.size:
            row = file.tables["TRAP"].rows_of(both[:1])[0][0]
            raise ValueError(f"[TRAP] line {file.tables['TRAP'].lines[row]}: gradient id {both[0]} is defined in "
                             "both [GRADIENTS] and [TRAP]; gradient ids are shared by the two sections")
