"""The HTTP routes beside MCP: file downloads and uploads, link renewal, health, metrics, the playground."""
