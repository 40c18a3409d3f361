"""The system user the embedded server runs as when tunefleet runs as root.

PostgreSQL refuses to run as root; as root the server runs as :data:`ROOT_RUN_AS`
(``tunefleet-pg``), created when missing, as a distribution package would do. A fresh machine
has no such user until the first start, and the creation is serialised under an exclusive
``flock`` on ``/etc/passwd`` (:func:`ensure_system_user` says why).
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from typing import Any

from tunefleet.db.embedded.logs import last_lines
from tunefleet.errors import EmbeddedServerError

ROOT_RUN_AS = "tunefleet-pg"

_USERADD = ("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin")


def ensure_system_user(name: str) -> Any:
    """The password entry of system user ``name``, created first when missing (root only).

    Several tunefleet processes on a fresh machine (the test sessions of ``pytest -n``, two
    commands started at once) find the user missing together. Their ``useradd`` calls race on
    the account files: one fails half-way and is rolled back while another process has
    already read the rolled-back entry and handed its uid to a data directory. So creation
    is serialised by an exclusive lock on ``/etc/passwd`` (advisory: the account tools lock
    other files, so nothing else waits on it) and the user is looked up again under it.
    """
    import pwd

    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    with open("/etc/passwd", "rb") as accounts:
        fcntl.flock(accounts, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
            try:
                created = subprocess.run(
                    [*_USERADD, name],
                    check=False,
                    capture_output=True,
                    text=True,
                )
                # Exit 9: a process outside tunefleet created it a moment ago.
                reason = "" if created.returncode in (0, 9) else last_lines(created.stderr)
            except FileNotFoundError:
                reason = "this system has no useradd"
            if reason:
                raise EmbeddedServerError(
                    f"PostgreSQL does not run as root and creating the system user "
                    f"{name!r} failed: {reason}; run tunefleet as an ordinary user"
                )
            return pwd.getpwnam(name)
        finally:
            fcntl.flock(accounts, fcntl.LOCK_UN)
