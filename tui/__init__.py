"""llmchat's faces: the Textual app and the command line. Nothing here imports httpx."""
