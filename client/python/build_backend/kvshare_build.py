# SPDX-License-Identifier: Apache-2.0
"""The build backend (PEP 517, PEP 660) of the Python package kvshare.

Why our own: kvshare is pure Python, and an engine's virtual environment on
a node without a package index has pip but not `wheel` (setuptools before
70 cannot build a wheel without it). This backend needs the standard library
alone, so `pip install client/python` works offline, with or without build
isolation. It packs the kvshare/ folder and the [project] table of
pyproject.toml (name, version, description, license, requires-python,
classifiers) into a py3-none-any wheel, an sdist, or an editable wheel.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "kvshare"


def _project():
    """The [project] table of pyproject.toml as a dict. tomllib (3.11+)
    reads it; before 3.11 a reader of `key = "string"` and `key = [strings]`
    lines is enough for our file (it has nothing else in that table)."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        pass
    with open(path, encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S).group(1)
    project = {}
    for m in re.finditer(r'^([\w-]+)\s*=\s*"([^"]*)"', table, re.M):
        project[m.group(1)] = m.group(2)
    for m in re.finditer(r"^([\w-]+)\s*=\s*\[(.*?)\]", table, re.M | re.S):
        project[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
    m = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', table, re.M)
    if m:
        project["license"] = {"text": m.group(1)}
    return project


def _metadata(project):
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"],
             "Version: " + project["version"]]
    if "description" in project:
        lines.append("Summary: " + project["description"])
    if "license" in project:
        lines.append("License: " + project["license"]["text"])
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    lines += ["Classifier: " + c for c in project.get("classifiers", [])]
    return "\n".join(lines) + "\n"


def _dist_info(project):
    return "%s-%s.dist-info" % (project["name"], project["version"])


def _sources():
    """(path in the archive, path on disk) of every .py file of the package."""
    root = os.path.join(HERE, PACKAGE)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                disk = os.path.join(dirpath, name)
                out.append((os.path.relpath(disk, HERE).replace(os.sep, "/"), disk))
    return out


def _write_wheel(wheel_directory, files):
    """files: (archive path, bytes). Adds the dist-info and RECORD; returns
    the wheel's file name."""
    project = _project()
    info = _dist_info(project)
    files = list(files) + [
        (info + "/METADATA", _metadata(project).encode()),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: kvshare_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append("%s,sha256=%s,%d" % (path, digest.decode(), len(data)))
    record.append(info + "/RECORD,,")
    files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = "%s-%s-py3-none-any.whl" % (project["name"], project["version"])
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(p, _read(d)) for p, d in _sources()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth file puts this folder on sys.path: edits to the
    sources show without reinstalling."""
    return _write_wheel(wheel_directory, [(PACKAGE + ".pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = "%s-%s" % (project["name"], project["version"])
    members = [(p, _read(d)) for p, d in _sources()]
    members += [("pyproject.toml", _read(os.path.join(HERE, "pyproject.toml"))),
                ("build_backend/kvshare_build.py", _read(os.path.abspath(__file__))),
                ("PKG-INFO", _metadata(project).encode())]
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz",
                      format=tarfile.PAX_FORMAT) as t:
        for path, data in members:
            ti = tarfile.TarInfo(base + "/" + path)
            ti.size = len(data)
            ti.mode = 0o644
            t.addfile(ti, io.BytesIO(data))
    return name
