import sys

from qgmem.cli import main

sys.exit(main())
