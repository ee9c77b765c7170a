import sys

from bitfit_hf.cli.main import main

sys.exit(main())
