"""Shared test setup: quiet MindSpore logs, GRAPH_MODE on CPU by default."""
import os
import socket
import sys

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402

ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (msrun's --master-port in the msrun tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
