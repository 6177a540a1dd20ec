import sys

from emulators.aws_proxy.server import main

sys.exit(main())
