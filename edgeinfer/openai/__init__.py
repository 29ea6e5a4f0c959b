"""The OpenAI API without HTTP: request schemas (schemas), parsing and the error type (protocol), what a
request asks of a loaded model (handlers), and response bodies and streamed chunks (responses).

Shared by the HTTP server (edgeinfer.server) and batch jobs (edgeinfer.batch), so a body is read,
refused and answered the same way by both. Imports the Python API, never the server or batch jobs.
"""
