"""Shared by the bench tools."""

import os
import subprocess


def commit():
    """Short commit hash of this tree; GPROJ_COMMIT=<hash> for a copy without .git (the GPU
    machine receives the working tree, not the repository)."""
    if os.environ.get("GPROJ_COMMIT"):
        return os.environ["GPROJ_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                       cwd=os.path.dirname(os.path.abspath(__file__)),
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None
