"""The OpenAI API without HTTP: request schemas (schemas), their validation (validation) and the OpenAPI
document (openapi), parsing and the error type (protocol), what a request asks of a loaded model
(handlers), response bodies and streamed chunks (responses), timestamps and keep_alive (times), and
Ollama's API over the same machinery (ollama_options, ollama_requests, ollama_replies, ollama_models).

Shared by the HTTP server (edgeinfer.server) and batch jobs (edgeinfer.batch), so a body is read,
refused and answered the same way by both. Imports the Python API, never the server or batch jobs.
"""
