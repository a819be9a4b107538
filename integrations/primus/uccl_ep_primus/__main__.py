"""``python -m uccl_ep_primus SCRIPT [ARGS...]``: register the backend with Primus-Turbo, check that its
selection picks uccl_ep (`uccl_ep_primus.activate`), then run SCRIPT as __main__."""

import os
import runpy
import sys

from uccl_ep.errors import MissingDependency, Unsupported

from . import activate


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        activate()
    except (MissingDependency, Unsupported) as exc:
        print(f"uccl-ep-primus: error: {exc}", file=sys.stderr)
        return 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"uccl-ep-primus: error: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
