import sys

from emulators.sns.server import main

sys.exit(main())
