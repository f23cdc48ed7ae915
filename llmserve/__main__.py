import sys

from llmserve.launcher import main

sys.exit(main())
