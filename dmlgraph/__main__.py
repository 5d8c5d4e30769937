import sys

from dmlgraph.cli import main

sys.exit(main())
