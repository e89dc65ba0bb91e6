import sys

from malletrain.cli import main

sys.exit(main())
