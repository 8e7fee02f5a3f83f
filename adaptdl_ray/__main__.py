"""``python -m adaptdl_ray``: the ``adaptdl-ray`` command line (see :mod:`adaptdl_ray.cli`)."""

import sys

from adaptdl_ray.cli import main

if __name__ == "__main__":
    sys.exit(main())
