import sys

from llmchat.tui.cli import main

sys.exit(main())
