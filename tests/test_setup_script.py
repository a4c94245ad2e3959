"""scripts/setup.sh: what it prints. (Running it whole installs ~1.9 GB; CI does that. Here: its parts.)"""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = (REPO / "scripts" / "setup.sh").read_text()

# What setuptools' editable build warns at its end (setuptools/command/editable_wheel.py, 69 to 84: a
# BuildBackendWarning/InformationOnly whose text starts with its summary), next to another warning.
EMIT = ("import warnings\n"
        "class BuildBackendWarning(UserWarning): pass\n"
        "warnings.warn('Editable installation.\\n!!\\n\\n  ****\\n  Please be careful with folders in your working '\n"
        "              'directory\\n  ****\\n!!', BuildBackendWarning)\n"
        "warnings.warn('Something that matters.', DeprecationWarning)\n")


def _stderr(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", EMIT], env={**os.environ, **env}, capture_output=True,
                          text=True).stderr


def test_editable_install_notice_is_silenced_and_nothing_else():
    assert re.search(r"^\s*pip_install_editable -e \.$", SETUP, re.M), "the project is installed through the filter"
    notice_filter = re.search(r'^EDITABLE_NOTICE_FILTER="([^"]+)"$', SETUP, re.M).group(1)
    loud = _stderr({"PYTHONWARNINGS": ""})
    assert "Editable installation." in loud and "Please be careful" in loud and "Something that matters." in loud
    quiet = _stderr({"PYTHONWARNINGS": notice_filter})
    assert "Editable installation" not in quiet and "Please be careful" not in quiet
    assert "Something that matters." in quiet
