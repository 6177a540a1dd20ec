import sys

from harness.sqs.server import main

sys.exit(main())
