"""Writing a report to a path the user named (``--output-file``, ``--baseline``).

A regular file, or a new one, is replaced through a temporary file in its directory
(``os.replace``), so a reader never sees half a report; a symlink is followed, so the link stays
a link. Anything else (``/dev/null``, ``/dev/stdout``, a FIFO, a terminal) is written in place:
replacing it would put a regular file where the device or the pipe was (as root, a run with
``--output-file /dev/null`` used to turn ``/dev/null`` into a file for every other program).
"""
from __future__ import annotations

import os
import stat
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_report(path: str, text: str) -> None:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(real, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".torchlint-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)  # never a temporary file left behind
        except OSError:
            pass
        raise
