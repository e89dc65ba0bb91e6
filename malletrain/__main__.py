import sys

from malletrain.cli.main import main

sys.exit(main())
