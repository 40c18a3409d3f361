"""The embedded database: a private PostgreSQL server in a data directory, no root, no Docker.

``tunefleet db start`` (and every command given no ``--db``) runs one; its modules, each
building on the ones above it:

``logs``         what the server and its programs said, read back for one-line errors
``system_user``  as root, the system user ``tunefleet-pg`` the server runs as (PostgreSQL
                 refuses root), created under a ``flock``
``binaries``     finding the server programs (the embedded extra's wheel, a distribution's
                 package, ``PATH``, ``$TUNEFLEET_PG_BIN``)
``datadir``      one data directory: its files and lock, initdb, the private socket, running
                 the programs (as the system user under root)
``upgrade``      carrying a directory made by an older PostgreSQL major forward (pg_upgrade,
                 verified row by row)
``server``       :class:`EmbeddedServer`: start or reuse, stop, status and URLs
``keeper``       starting a server that died under a command running on it again (``tune``)

The names callers use are importable from here (``from tunefleet.db.embedded import
EmbeddedServer``).
"""

from tunefleet.db.embedded.binaries import (
    WHEEL_PACKAGES,
    Binaries,
    find_bin_dir,
    find_binaries,
    find_old_binaries,
)
from tunefleet.db.embedded.datadir import SHORT_TEMP_DIRS, SOCKET_PATH_MAX, SUPERUSER
from tunefleet.db.embedded.server import (
    DATABASE,
    DEFAULT_PORT,
    REMOTE_ROLE,
    EmbeddedServer,
    ServerStatus,
    default_server,
)
from tunefleet.db.embedded.system_user import ROOT_RUN_AS, ensure_system_user

__all__ = [
    "DATABASE",
    "DEFAULT_PORT",
    "REMOTE_ROLE",
    "ROOT_RUN_AS",
    "SHORT_TEMP_DIRS",
    "SOCKET_PATH_MAX",
    "SUPERUSER",
    "WHEEL_PACKAGES",
    "Binaries",
    "EmbeddedServer",
    "ServerStatus",
    "default_server",
    "ensure_system_user",
    "find_bin_dir",
    "find_binaries",
    "find_old_binaries",
]
