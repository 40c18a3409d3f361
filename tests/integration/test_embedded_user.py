"""As root the embedded server runs as a system user that tunefleet creates on first use.

On a fresh machine several tunefleet processes find that user missing at the same moment
(``pytest -n 3``'s sessions did, every time CI started on a new machine): their ``useradd``
calls raced, one was rolled back after another process had read its uid, and that process's
``initdb`` failed with "could not look up effective user ID". Here several processes create
one throw-away user at once; all of them must see the same, existing account.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.queue_data import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None,
    reason="creating system users needs root and useradd/userdel",
)

# Imported first, then ready, then all released at once: the lookups themselves race.
_CHILD = """
import sys, time
from pathlib import Path
from tunefleet.db.embedded import ensure_system_user
Path(sys.argv[3]).touch()
go = Path(sys.argv[2])
deadline = time.monotonic() + 120
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.001)
entry = ensure_system_user(sys.argv[1])
print(entry.pw_uid, entry.pw_gid)
"""


@pytest.mark.parametrize("round_", range(3))
def test_processes_creating_the_server_user_at_once_all_get_the_one_account(
    tmp_path: Path, round_: int
) -> None:
    name = f"tf-test-{os.getpid() % 100000}-{round_}"
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, name, str(go), str(tmp_path / f"ready-{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    try:

        def ready() -> bool:
            assert all(child.poll() is None for child in children), "a child exited early"
            return len(list(tmp_path.glob("ready-*"))) == len(children)

        wait_until(ready, timeout=120, interval=0.01, what="the children to get ready")
        go.touch()
        results = [child.communicate(timeout=120) for child in children]
        for child, (_, err) in zip(children, results, strict=True):
            assert child.returncode == 0, err
        account = pwd.getpwnam(name)
        seen = {tuple(map(int, out.split())) for out, _ in results}
        assert seen == {(account.pw_uid, account.pw_gid)}
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        subprocess.run(["userdel", name], capture_output=True, check=False)
        subprocess.run(["groupdel", name], capture_output=True, check=False)
