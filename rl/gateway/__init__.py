"""The OpenAI-compatible endpoint: requests, rendering, token capture, serving."""
