"""The file readers moved to ``mtpdiag.inputs`` (one module per format); this name stays importable."""

from mtpdiag.inputs import (DUMP_SUFFIXES, STATE_UNKNOWN, FileCaptures, TextProcess, load_file, load_paths,
                            parse_text_dump, rank_from_name, read_inputs)

__all__ = ["DUMP_SUFFIXES", "STATE_UNKNOWN", "FileCaptures", "TextProcess", "load_file", "load_paths",
           "parse_text_dump", "rank_from_name", "read_inputs"]
