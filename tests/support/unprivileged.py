"""Running a command as a user whom file modes stop, when the tests run as root.

Root reads and writes through mode bits, so a folder at ``0555`` or another user's ``0700``
stops it nowhere. As root, a command runs here without the capabilities that let it
(``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``, dropped from the bounding
set with ``setpriv``): modes then bind it as they bind any user, which is what root meets on
an NFS export with root squashing or a FUSE mount it does not own. A real second user would
need this interpreter and checkout readable by it (on a machine whose Python lives under
``/root``, it is not) and pytest's ``0700`` temporary folders opened to it; dropping the
capabilities needs neither. Not root: the command runs as it is. Root without ``setpriv``:
:data:`AS_UNPRIVILEGED` is None and the tests that need it skip with :data:`SKIP_REASON`.
"""

from __future__ import annotations

import os
import shutil

#: The argv prefix that runs a command bound by file modes (empty when not root).
AS_UNPRIVILEGED: list[str] | None
if os.geteuid() != 0:
    AS_UNPRIVILEGED = []
else:
    _setpriv = shutil.which("setpriv")
    AS_UNPRIVILEGED = ([_setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
                       if _setpriv else None)

SKIP_REASON = "running as root without setpriv: file modes would not bind the command"
