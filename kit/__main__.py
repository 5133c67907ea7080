import sys

from kit.cli import main

sys.exit(main())
