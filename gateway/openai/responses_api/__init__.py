"""The Responses API (`POST /v1/responses`): a request translated into the chat completion the pipeline already
serves (gateway/openai/generation.py), and the chat reply translated back into a Response, whole or as its
typed event stream (docs/gateway.md, "The Responses API")."""
