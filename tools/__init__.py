"""Development tools: checks run by `make lint`, not part of the anatomy package."""
