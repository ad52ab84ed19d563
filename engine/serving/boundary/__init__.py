"""The engine boundary: the messages that cross it, the `EngineClient` the gateway holds, the front that turns
outputs into streams, and the two ways the loop runs behind it (a thread, or a worker process over ZeroMQ
or a pipe). Engines on their own, over TCP, are engine/serving/remote/."""
