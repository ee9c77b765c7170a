"""``python -m bitfit_hf.study``: see :mod:`bitfit_hf.study.command`."""

import sys

from bitfit_hf.study.command import main

if __name__ == "__main__":
    sys.exit(main())
