"""What ``inspect`` imports, and when: it runs while a job hangs, so its start-up is part of the wait.

``capture()`` starts py-spy on every rank and then runs ``pipeline.import_ahead`` while py-spy dumps them: the
imports overlap that wait only if ``import_ahead`` imports what the diagnosis and the report will, and the
capture itself loads no more than it needs before py-spy starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BUNDLE = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "mtp_cp_pp" / "bundle.json"


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_the_live_capture_loads_no_file_reader_but_py_spys_and_no_analysis_or_report():
    code = "import sys, mtpdiag.capture\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('mtpdiag.'))))"
    loaded = set(_run(code).split())
    assert "mtpdiag.inputs.pyspy_json" in loaded  # the control: py-spy's output is read by the JSON reader
    assert not loaded & {
        "mtpdiag.inputs.registry",
        "mtpdiag.inputs.bundle",
        "mtpdiag.inputs.merge",
        "mtpdiag.inputs.pyspy_text",
        "mtpdiag.inputs.pystack",
        "mtpdiag.inputs.faulthandler",
    }
    assert not {m for m in loaded if m.split(".")[1] in ("analysis", "report", "pipeline", "commands")}


def test_import_ahead_imports_what_the_diagnosis_and_each_report_import():
    """After ``import_ahead(formats)``, diagnosing a recorded hang and rendering it in those formats imports no
    further mtpdiag module (and, for the console, no rich module): each import left out would follow py-spy's
    wait instead of overlapping it."""
    code = (
        "import sys\n"
        "from mtpdiag import pipeline\n"
        "from mtpdiag.inputs import load_paths\n"
        "from mtpdiag.report import render\n"
        f"snapshot = load_paths([{str(BUNDLE)!r}])\n"
        "for formats in (('json',), ('console', 'html')):\n"
        "    pipeline.import_ahead(formats)\n"
        "    before = set(sys.modules)\n"
        "    report = pipeline.diagnose_snapshot(snapshot, pipeline.LayoutOptions(cp=2, pp=2))\n"
        "    for fmt in formats:\n"
        "        render(report, fmt)\n"
        "    late = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('mtpdiag', 'rich'))\n"
        "    print(','.join(formats), len(report.findings), ' '.join(late))\n"
    )
    lines = _run(code).splitlines()
    assert [line.split()[0] for line in lines] == ["json", "console,html"]
    for line in lines:
        formats, findings, *late = line.split()
        assert int(findings) > 0  # the control: the recorded hang is diagnosed, so the analysis ran
        assert late == [], f"{formats}: imported only after import_ahead: {late}"


def test_reading_bundles_loads_no_other_reader_nor_the_rank_rules_of_file_names_nor_the_text_lines():
    code = (
        "import sys\n"
        "from mtpdiag.inputs import read_inputs\n"
        f"snapshot = read_inputs([{str(BUNDLE)!r}]).snapshot\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('mtpdiag.inputs.'))\n"
        "print(len(snapshot.captures), ' '.join(loaded))"
    )
    count, *loaded = _run(code).split()
    assert int(count) == 4 and "mtpdiag.inputs.bundle" in loaded  # the control: the bundle was read
    assert not set(loaded) & {
        "mtpdiag.inputs.pyspy_json",
        "mtpdiag.inputs.identity",
        "mtpdiag.inputs.pyspy_text",
        "mtpdiag.inputs.pystack",
        "mtpdiag.inputs.faulthandler",
        "mtpdiag.inputs.failed",
        "mtpdiag.inputs.lines",
    }
    code = (
        "import sys\n"
        "from mtpdiag.inputs import read_inputs\n"
        f"read_inputs([{str(BUNDLE)!r}], rank_from='node-(\\\\d+)')\n"
        "print('mtpdiag.inputs.identity' in sys.modules)"
    )
    assert _run(code) == "True"  # --rank-from is compiled by the rank rules
