"""A PEP 517 build backend that packages the `loom` package already built in
this directory (loom/*.py and the extension loom/_loom*.so) as a wheel, using
only the standard library, so that `pip install --no-index` works offline.
Copied into the build tree by python/CMakeLists.txt; no sdist."""

import base64
import hashlib
import os
import sysconfig
import zipfile

NAME = "loom"
HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("version"):
                return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("pyproject.toml has no version")


def _tag():
    """cp311-cp311-linux_x86_64: the interpreter the extension was built for."""
    ext = next((f for f in os.listdir(os.path.join(HERE, NAME)) if f.startswith("_loom.")), None)
    if ext is None:
        raise RuntimeError("%s/%s has no built extension _loom.*: build the project first"
                           % (HERE, NAME))
    impl = "cp%d%d" % tuple(int(x) for x in sysconfig.get_python_version().split("."))
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, impl, platform)


def _digest(data):
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + h.decode()


def get_requires_for_build_wheel(config_settings=None):
    return []


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: Loom: hidden states, perplexity and memory plans of Hugging Face models\n"
            "Requires-Python: >=3.9\nRequires-Dist: numpy\n" % (NAME, version))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = "%s-%s.dist-info" % (NAME, _version())
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w") as f:
        f.write(_metadata(_version()))
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version, tag = _version(), _tag()
    info = "%s-%s.dist-info" % (NAME, version)
    files = []
    for name in sorted(os.listdir(os.path.join(HERE, NAME))):
        if name.endswith(".py") or name.startswith("_loom."):
            with open(os.path.join(HERE, NAME, name), "rb") as f:
                files.append(("%s/%s" % (NAME, name), f.read()))
    files.append((info + "/METADATA", _metadata(version).encode()))
    files.append((info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: loom_wheel\n"
                                    "Root-Is-Purelib: false\nTag: %s\n" % tag).encode()))
    record = "".join("%s,%s,%d\n" % (n, _digest(d), len(d)) for n, d in files)
    record += info + "/RECORD,,\n"
    files.append((info + "/RECORD", record.encode()))
    wheel = "%s-%s-%s.whl" % (NAME, version, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(n, d)
    return wheel
