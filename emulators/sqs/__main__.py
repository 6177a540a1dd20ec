import sys

from emulators.sqs.server import main

sys.exit(main())
